"""An Anthropic Messages request as the chat request the engine already runs.

- ``system`` becomes a system message; ``text`` blocks are joined by newlines;
- an assistant turn's ``tool_use`` blocks become its ``tool_calls`` (ids kept), and a
  user turn's ``tool_result`` blocks become ``tool`` messages, in order, before its text
  (an ``is_error`` result is prefixed with ``Error:``);
- ``tools`` become functions (``input_schema`` as ``parameters``); ``tool_choice``
  ``auto`` / ``any`` / ``tool`` / ``none`` become ``auto`` / ``required`` / the named
  function / ``none``, and ``disable_parallel_tool_use`` turns off parallel calls;
- ``output_config.format`` becomes a ``json_schema`` response format;
- a last ``assistant`` turn is a prefill: the reply continues its text (``prefill``).

Pure: no model, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from conveyor.endpoints.chat_schemas import ChatCompletionRequest
from conveyor.endpoints.messages.schemas import (
    MessageParam,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    _Conversation,
)
from conveyor.endpoints.validation import invalid_from_validation
from conveyor.errors import InvalidRequest

__all__ = ["ConvertedRequest", "chat_messages", "to_chat"]

ERROR_PREFIX = "Error: "
# The reply's size when only the prompt is wanted (count_tokens): any valid value.
_UNUSED_MAX_TOKENS = 1


@dataclass(frozen=True, slots=True)
class ConvertedRequest:
    """The chat request, and the text of a final assistant turn the reply continues."""

    chat: ChatCompletionRequest
    prefill: str = ""


def to_chat(request: _Conversation) -> ConvertedRequest:
    """The chat request for ``request`` (a ``MessagesRequest``, or only its conversation)."""
    messages, prefill = _split_prefill(request.messages)
    body: dict[str, Any] = {"model": request.model, "messages": chat_messages(request, messages)}
    body.update(_tool_fields(request))
    if request.output_config is not None and request.output_config.format is not None:
        schema = request.output_config.format.schema_
        body["response_format"] = {
            "type": "json_schema", "json_schema": {"name": "output", "schema": schema},
        }  # fmt: skip
    body.update(_sampling_fields(request))
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # the Messages schema checked first: rare
        problem = invalid_from_validation(exc).message
        raise InvalidRequest(f"the request cannot run as a conversation: {problem}") from None
    return ConvertedRequest(chat, prefill)


def _split_prefill(messages: list[MessageParam]) -> tuple[list[MessageParam], str]:
    """The turns before a final assistant turn, and that turn's text (the prefill)."""
    last = messages[-1]
    if last.role != "assistant":
        return messages, ""
    if not isinstance(last.content, str) and any(
        isinstance(block, ToolUseBlock) for block in last.content
    ):
        raise InvalidRequest(
            "a final assistant message may only hold text (the start of the reply); its "
            "tool_use blocks need a user message with their tool_result blocks after it",
            param="messages",
        )
    prefill = last.text
    if prefill != prefill.rstrip():
        raise InvalidRequest(
            "final assistant content cannot end with trailing whitespace", param="messages"
        )
    if len(messages) == 1:
        raise InvalidRequest("messages must start with a user message", param="messages")
    return messages[:-1], prefill


def chat_messages(request: _Conversation, messages: list[MessageParam]) -> list[dict[str, Any]]:
    """The system prompt and ``messages`` as chat messages."""
    converted: list[dict[str, Any]] = []
    if request.system_text:
        converted.append({"role": "system", "content": request.system_text})
    for message in messages:
        if isinstance(message.content, str):
            converted.append({"role": message.role, "content": message.content})
        elif message.role == "assistant":
            converted.append(_assistant_message(message))
        else:
            converted.extend(_user_messages(message))
    return converted


def _assistant_message(message: MessageParam) -> dict[str, Any]:
    """An assistant turn: its text, and its ``tool_use`` blocks as ``tool_calls``."""
    calls = [
        {"id": block.id, "type": "function",
         "function": {"name": block.name, "arguments": json.dumps(block.input)}}
        for block in message.content
        if isinstance(block, ToolUseBlock)
    ]  # fmt: skip
    converted: dict[str, Any] = {"role": "assistant", "content": message.text}
    if calls:
        converted["tool_calls"] = calls
    return converted


def _user_messages(message: MessageParam) -> list[dict[str, Any]]:
    """A user turn: one ``tool`` message per result, then one user message with the text."""
    converted: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            content = (ERROR_PREFIX if block.is_error else "") + block.text
            converted.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
            )
        elif isinstance(block, TextBlock):
            texts.append(block.text)
    if texts or not converted:
        converted.append({"role": "user", "content": "\n".join(texts)})
    return converted


def _tool_fields(request: _Conversation) -> dict[str, Any]:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of the chat request."""
    if not request.tools:
        return {"tool_choice": "none"} if request.tool_choice is not None else {}
    functions = []
    for tool in request.tools:
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        functions.append({"type": "function", "function": function})
    fields: dict[str, Any] = {"tools": functions}
    choice = request.tool_choice
    if choice is None:
        return fields
    if choice.type == "tool":
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use:
        fields["parallel_tool_calls"] = False
    return fields


def _sampling_fields(request: _Conversation) -> dict[str, Any]:
    """``max_tokens``, ``stop`` and the sampling settings (only a Messages request has them)."""
    if not isinstance(request, MessagesRequest):
        return {"max_tokens": _UNUSED_MAX_TOKENS}
    fields: dict[str, Any] = {"max_tokens": request.max_tokens}
    if request.stop_sequences:
        fields["stop"] = list(request.stop_sequences)
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(request, name)
        if value is not None:
            fields[name] = value
    return fields
