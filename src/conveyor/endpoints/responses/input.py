"""A request's input as stored and listed: items in OpenAI's shapes, each with an id.

Messages hold ``input_text`` parts (``output_text`` or ``refusal`` for the assistant's);
``function_call`` and ``function_call_output`` items keep their ``call_id``; handed-back
``reasoning`` items are kept (with no content) so the list shows what was sent. Stored
items parse again as input items, so a conversation can be run from them as they are.
No torch here: the gateway lists stored items too.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from conveyor.endpoints.responses.item_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
)
from conveyor.endpoints.responses.schemas import ResponseRequest

__all__ = ["input_items", "items_chars", "new_item_id"]

_ID_HEX_CHARS = 32


def new_item_id(prefix: str) -> str:
    """A fresh item id: ``msg_...``, ``fc_...``, ``fco_...``, ``rs_...``."""
    return f"{prefix}_{secrets.token_hex(_ID_HEX_CHARS // 2)}"


def input_items(request: ResponseRequest) -> list[dict[str, Any]]:
    """The request's input as stored items, each with an id (a given id is kept)."""
    if isinstance(request.input, str):
        return [_message("user", request.input, None)]
    return [_stored(item) for item in request.input]


def _stored(item: Any) -> dict[str, Any]:
    """One parsed input item in its stored shape."""
    if isinstance(item, MessageItem):
        if isinstance(item.content, str):
            return _message(item.role, item.content, item.id)
        parts = [_part(item.role, part.type, part.plain) for part in item.content]
        return {**_message(item.role, "", item.id), "content": parts}
    if isinstance(item, FunctionCallItem):
        return {
            "id": item.id or new_item_id("fc"), "type": "function_call",
            "call_id": item.call_id, "name": item.name, "arguments": item.arguments,
            "status": "completed",
        }  # fmt: skip
    if isinstance(item, FunctionCallOutputItem):
        return {
            "id": item.id or new_item_id("fco"), "type": "function_call_output",
            "call_id": item.call_id, "output": item.text, "status": "completed",
        }  # fmt: skip
    if isinstance(item, ReasoningItem):
        return {"id": item.id or new_item_id("rs"), "type": "reasoning", "summary": []}
    raise TypeError(f"not an input item: {item!r}")


def _message(role: str, text: str, item_id: str | None) -> dict[str, Any]:
    """A stored message holding one text part."""
    return {
        "id": item_id or new_item_id("msg"), "type": "message", "role": role,
        "status": "completed", "content": [_part(role, "text", text)],
    }  # fmt: skip


def _part(role: str, kind: str, text: str) -> dict[str, Any]:
    """A stored content part: ``output_text`` (or ``refusal``) for the assistant."""
    if role != "assistant":
        return {"type": "input_text", "text": text}
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": []}


def items_chars(items: Sequence[dict[str, Any]]) -> int:
    """About how many characters of text stored items hold (decides off-loop work)."""
    total = 0
    for item in items:
        value = item.get("content", item.get("arguments", item.get("output", "")))
        if isinstance(value, list):
            total += sum(len(str(part.get("text", ""))) for part in value if isinstance(part, dict))
        else:
            total += len(str(value))
    return total
