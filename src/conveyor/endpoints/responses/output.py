"""The Response object's fields: what echoes the request, ``usage`` and ``error``.

Response ids are made in ``conveyor.response_ids`` (a gateway reads them there too).
"""

from __future__ import annotations

from typing import Any

from conveyor.endpoints.responses.item_schemas import AllowedTools, FunctionChoice
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.errors import ConveyorError

__all__ = ["envelope", "error_body", "error_object", "response_object", "usage_object"]


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
    ``usage`` comes last, where a gateway reads it from an answer's final bytes to settle
    its rate limits.
    """
    body = {**base, "status": status, "output": output, "error": error}
    body.pop("usage", None)
    if status == "incomplete":
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    if completed_at is not None and status == "completed":
        body["completed_at"] = completed_at
    body["usage"] = usage
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
    """A failed response's ``error`` for ``exc``."""
    return error_body(exc.status_code, exc.message)


def error_body(status_code: int, message: str) -> dict[str, Any]:
    """A failed response's ``error``: OpenAI's code for the HTTP status, and what happened."""
    if status_code == 429:
        code = "rate_limit_exceeded"
    elif 400 <= status_code < 500:
        code = "invalid_prompt"
    else:
        code = "server_error"
    return {"code": code, "message": message}
