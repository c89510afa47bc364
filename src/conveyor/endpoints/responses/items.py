"""A conversation's items as the chat path runs them.

A conversation is the previous response's input items and output followed by the new
input, all in their stored shapes (``input``); the model sees it as chat messages:

- ``instructions`` is a system message first (a previous response's are not carried on,
  as OpenAI has it); ``developer`` messages are system messages too;
- ``function_call`` items join the assistant message just before them (or one of their
  own) as ``tool_calls``; a ``function_call_output`` is a ``tool`` message;
- ``reasoning`` items are kept for listing but not shown to the model.

The rest of the body maps onto the chat request the chat path runs: ``text.format`` to
``response_format``, ``tools`` / ``tool_choice`` to theirs (``allowed_tools`` narrows the
tools), ``max_output_tokens`` to ``max_completion_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.endpoints.chat_schemas import ChatCompletionRequest
from conveyor.endpoints.responses.item_schemas import AllowedTools, FunctionChoice
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest

__all__ = ["chat_messages", "chat_request"]


def _text(parts: Sequence[dict[str, Any]] | str) -> str:
    """A stored content list (or an output string) as one string."""
    if isinstance(parts, str):
        return parts
    return "".join(str(part.get("text", part.get("refusal", ""))) for part in parts)


def chat_messages(
    instructions: str | None, items: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The conversation as chat messages (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    caller: dict[str, Any] | None = None  # the assistant message calls may join
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _text(item["content"])})
            caller = messages[-1] if role == "assistant" else None
        elif kind == "function_call":
            if caller is None:
                caller = {"role": "assistant", "content": ""}
                messages.append(caller)
            function = {"name": item["name"], "arguments": item["arguments"]}
            call = {"id": item["call_id"], "type": "function", "function": function}
            caller.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
            )
            caller = None
    return messages


def chat_request(
    request: ResponseRequest, items: Sequence[dict[str, Any]], *, num_dropped: int = 0
) -> ChatCompletionRequest:
    """The chat request that runs ``request`` on the conversation ``items``.

    ``num_dropped`` leaves out that many of the oldest messages after the instructions
    (``truncation: auto``).
    """
    messages = chat_messages(request.instructions, items)
    if not messages:
        raise InvalidRequest("the input holds nothing the model can read", param="input")
    start = 1 if request.instructions else 0
    del messages[start : start + num_dropped]
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    optional = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_completion_tokens": request.max_output_tokens,
        "parallel_tool_calls": request.parallel_tool_calls,
        "response_format": _response_format(request),
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    body.update(_tools(request))
    if request.wants_logprobs:
        body.update(logprobs=True, top_logprobs=request.top_logprobs or 0)
    try:
        return parse_body(ChatCompletionRequest, body)
    except InvalidRequest as exc:
        raise InvalidRequest(f"the input cannot run: {exc.message}", param="input") from None


def _response_format(request: ResponseRequest) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None: free text)."""
    text_format = request.text.format if request.text is not None else None
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": text_format.name, "schema": text_format.schema_}
    if text_format.strict is not None:
        schema["strict"] = text_format.strict
    return {"type": "json_schema", "json_schema": schema}


def _tools(request: ResponseRequest) -> dict[str, Any]:
    """``tools`` and ``tool_choice`` in chat's shapes (``allowed_tools`` narrows the list)."""
    if not request.tools:
        return {}
    choice = request.tool_choice
    allowed = set(choice.names) if isinstance(choice, AllowedTools) else None
    tools = [
        {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
        for tool in request.tools
        if allowed is None or tool.name in allowed
    ]
    result: dict[str, Any] = {"tools": tools}
    if isinstance(choice, FunctionChoice):
        result["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif isinstance(choice, AllowedTools):
        result["tool_choice"] = choice.mode
    elif choice is not None:
        result["tool_choice"] = choice
    return result
