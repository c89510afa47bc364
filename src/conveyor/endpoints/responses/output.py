"""The Response object's fields: ids, what echoes the request, ``usage`` and ``error``.

A response id is ``resp_`` and 48 hex digits: 16 name the conversation (a first turn
draws them, a later turn inherits them from its ``previous_response_id``), 32 are its
own. A gateway routes by the conversation key (``conversation_key``), so every turn of a
conversation after the first goes to the same worker, whose cache holds its prefix.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from conveyor.endpoints.responses.item_schemas import AllowedTools, FunctionChoice
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.errors import ConveyorError

__all__ = [
    "RESPONSE_ID_PREFIX",
    "conversation_key",
    "envelope",
    "error_object",
    "new_response_id",
    "response_object",
    "usage_object",
]

RESPONSE_ID_PREFIX = "resp_"
_KEY_HEX = 16
_OWN_HEX = 32
_ID = re.compile(rf"^{RESPONSE_ID_PREFIX}([0-9a-f]{{{_KEY_HEX}}})[0-9a-f]{{{_OWN_HEX}}}$")


def new_response_id(previous_id: str | None = None) -> str:
    """A fresh id in the conversation of ``previous_id`` (a new conversation without one)."""
    key = conversation_key(previous_id) if previous_id else None
    key = key or secrets.token_hex(_KEY_HEX // 2)
    return f"{RESPONSE_ID_PREFIX}{key}{secrets.token_hex(_OWN_HEX // 2)}"


def conversation_key(response_id: str) -> str | None:
    """The conversation part of a response id Conveyor made, else None."""
    match = _ID.match(response_id)
    return match.group(1) if match else None


def envelope(request: ResponseRequest, response_id: str, created_at: int) -> dict[str, Any]:
    """The fields a response echoes from its request, in progress and with no output yet."""
    text_format = request.text.format if request.text is not None else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": bool(request.background),
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "model": request.model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": request.reasoning or {"effort": None, "summary": None},
        "service_tier": "default",
        "store": request.is_stored,
        "temperature": 1.0 if request.temperature is None else float(request.temperature),
        "text": {"format": text_format.echo() if text_format else {"type": "text"}},
        "tool_choice": _tool_choice(request),
        "tools": [_tool(tool) for tool in request.tools or []],
        "top_logprobs": request.top_logprobs,
        "top_p": 1.0 if request.top_p is None else float(request.top_p),
        "truncation": request.truncation or "disabled",
        "usage": None,
        "user": request.user,
        "metadata": request.metadata or {},
    }


def _tool_choice(request: ResponseRequest) -> Any:
    """``tool_choice`` as a response shows it (OpenAI's default: ``auto``)."""
    choice = request.tool_choice
    if isinstance(choice, FunctionChoice | AllowedTools):
        return choice.model_dump()
    return choice or "auto"


def _tool(tool: Any) -> dict[str, Any]:
    """A function tool as a response lists it."""
    return {
        "type": "function", "name": tool.name, "description": tool.description,
        "parameters": tool.parameters, "strict": tool.strict,
    }  # fmt: skip


def response_object(
    base: dict[str, Any],
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """The Response object from its ``envelope`` and what the run produced.

    An ``incomplete`` response was cut by ``max_output_tokens`` (the only cut there is).
    """
    body = {**base, "status": status, "output": output, "usage": usage, "error": error}
    if status == "incomplete":
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    if completed_at is not None and status == "completed":
        body["completed_at"] = completed_at
    return body


def usage_object(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """OpenAI's Responses ``usage`` (no cached or reasoning tokens are counted)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def error_object(exc: ConveyorError) -> dict[str, Any]:
    """A failed response's ``error``, in OpenAI's codes (the message says what happened)."""
    if exc.status_code == 429:
        code = "rate_limit_exceeded"
    elif 400 <= exc.status_code < 500:
        code = "invalid_prompt"
    else:
        code = "server_error"
    return {"code": code, "message": exc.message}
