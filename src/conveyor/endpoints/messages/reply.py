"""Anthropic's ``message`` object for a finished reply, and why the reply stopped.

Pure: the reply's text is split into ``text`` and ``tool_use`` blocks by the chat path's
tool-call parser; nothing here runs a model.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from conveyor.endpoints.generation import ChoiceResult, GenerationRun
from conveyor.endpoints.tools import ParsedCall, parse_tool_calls
from conveyor.engine.outputs import FinishReason

__all__ = [
    "message_body",
    "message_id",
    "new_tool_use_id",
    "stop_reason",
    "tool_input",
    "usage_body",
]

MESSAGE_ID_PREFIX = "msg_"
TOOL_USE_ID_PREFIX = "toolu_"


def message_id(run: GenerationRun) -> str:
    """The ``msg_...`` id of the run's message (the run's own id, Anthropic's prefix)."""
    return MESSAGE_ID_PREFIX + run.id.rpartition("-")[2]


def new_tool_use_id() -> str:
    """A fresh id in Anthropic's ``toolu_...`` form."""
    return f"{TOOL_USE_ID_PREFIX}{uuid.uuid4().hex[:24]}"


def stop_reason(finish_reason: str | None, stop_string: str | None, num_calls: int) -> str:
    """Anthropic's ``stop_reason``: ``max_tokens`` when cut, ``tool_use`` after calls,
    ``stop_sequence`` when one of the caller's sequences ended it, else ``end_turn``."""
    if finish_reason == FinishReason.LENGTH.value:
        return "max_tokens"
    if num_calls:
        return "tool_use"
    if stop_string is not None:
        return "stop_sequence"
    return "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object; a call cut short is read as far as it got
    (an empty object when nothing of it can be read)."""
    try:
        value = from_json(arguments, allow_partial="trailing-strings") if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_body(num_input_tokens: int, num_output_tokens: int) -> dict[str, int]:
    """Anthropic's ``usage`` (Conveyor's prefix cache is not reported as cache reads)."""
    return {"input_tokens": num_input_tokens, "output_tokens": num_output_tokens}


def message_body(run: GenerationRun, results: Sequence[ChoiceResult]) -> dict[str, Any]:
    """The ``message`` object of a finished run (one choice)."""
    result = results[0]
    text: str | None = result.text
    calls: list[ParsedCall] = []
    if run.tool_names:
        is_cut = result.finish_reason == FinishReason.LENGTH.value
        text, calls = parse_tool_calls(result.text, run.tool_names, is_cut=is_cut)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [tool_use_block(call.name, tool_input(call.arguments)) for call in calls]
    return {
        "id": message_id(run),
        "type": "message",
        "role": "assistant",
        "model": run.model,
        "content": content,
        "stop_reason": stop_reason(result.finish_reason, result.stop_string, len(calls)),
        "stop_sequence": result.stop_string,
        "usage": usage_body(run.total_prompt_tokens, result.num_output_tokens),
    }


def tool_use_block(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` content block with a fresh id."""
    return {"type": "tool_use", "id": new_tool_use_id(), "name": name, "input": arguments}
