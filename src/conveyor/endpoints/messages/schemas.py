"""The bodies of ``/v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's shapes).

Content blocks Conveyor can put into a prompt are ``text``, ``tool_use`` and
``tool_result``; ``thinking`` blocks sent back from an earlier reply are accepted and left
out of the prompt. Images, documents and server tools (web search, code execution, ...)
are refused with a 400 naming them. Unknown fields are refused, as everywhere in Conveyor;
the fields in ``IGNORED_FIELDS`` are accepted and change nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from conveyor.endpoints.generation_schemas import MAX_STOP_STRINGS, Number, _Body
from conveyor.endpoints.validation import FastList
from conveyor.input_limits import utf8_size

__all__ = [
    "IGNORED_FIELDS",
    "Block",
    "CountTokensRequest",
    "MessageParam",
    "MessagesRequest",
    "TextBlock",
    "ToolChoice",
    "ToolResultBlock",
    "ToolUseBlock",
]

# Accepted for compatibility; none of them changes what Conveyor produces.
IGNORED_FIELDS = (
    "metadata", "service_tier", "thinking", "cache_control", "inference_geo", "speed",
    "output_config.effort", "citations", "tools[].strict",
)  # fmt: skip

_TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
_BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
_UNSUPPORTED_BLOCK_HINT = "Conveyor's models read text: use text, tool_use and tool_result"


class TextBlock(_Body):
    """``{"type": "text", "text": ...}``; citations and cache control are ignored."""

    type: Literal["text"]
    text: StrictStr
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ToolUseBlock(_Body):
    """A call the assistant made earlier: its id, the tool's name and the input object."""

    type: Literal["tool_use"]
    id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Body):
    """What the client's tool returned for the call ``tool_use_id``."""

    type: Literal["tool_result"]
    tool_use_id: StrictStr = Field(min_length=1)
    content: StrictStr | FastList[TextBlock] | None = None
    is_error: StrictBool | None = None
    cache_control: dict[str, Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        _check_block_types(value, ("text",))
        return value

    @property
    def text(self) -> str:
        """The result as one string (text parts joined by newlines)."""
        content = self.content
        if isinstance(content, list):
            return "\n".join(part.text for part in content)
        return content or ""


class ThinkingBlock(_Body):
    """A reasoning block of an earlier reply, sent back as history: left out of the prompt."""

    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr | None = None


class RedactedThinkingBlock(_Body):
    """An encrypted reasoning block sent back as history: left out of the prompt."""

    type: Literal["redacted_thinking"]
    data: StrictStr


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


def _check_block_types(value: Any, allowed: tuple[str, ...]) -> None:
    """A clear 400 for a block of a type Conveyor cannot use (before pydantic's own pass)."""
    if not isinstance(value, list):
        return
    for block in value:
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind not in allowed:
            raise ValueError(f"content blocks of type {kind!r} are not supported here; "
                             f"{_UNSUPPORTED_BLOCK_HINT}")  # fmt: skip


class MessageParam(_Body):
    """One turn: ``user`` or ``assistant``, with a string or a list of blocks."""

    role: Literal["user", "assistant"]
    content: StrictStr | FastList[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _known_blocks(cls, value: Any) -> Any:
        _check_block_types(value, _BLOCK_TYPES)
        return value

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> MessageParam:
        if isinstance(self.content, str):
            return self
        kinds = {block.type for block in self.content}
        if self.role == "user" and "tool_use" in kinds:
            raise ValueError("tool_use blocks belong in assistant messages")
        if self.role == "assistant" and "tool_result" in kinds:
            raise ValueError("tool_result blocks belong in user messages")
        return self

    @property
    def text(self) -> str:
        """The text blocks joined by newlines (the whole content when it is a string)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(block.text for block in self.content if isinstance(block, TextBlock))


class Tool(_Body):
    """A client tool: a name, a description and the JSON schema of its input."""

    name: StrictStr = Field(pattern=_TOOL_NAME)
    description: StrictStr | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolChoice(_Body):
    """``auto`` (the model decides), ``any`` (some tool), ``tool`` (that one) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool | None = None

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice of type 'tool' needs 'name' (and only it takes one)")
        return self


class Metadata(_Body):
    """``metadata``: an opaque user id, ignored."""

    user_id: StrictStr | None = None


class OutputFormat(_Body):
    """``output_config.format``: the reply is JSON valid for ``schema``."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    """``output_config``: a JSON ``format`` is enforced; ``effort`` is ignored."""

    format: OutputFormat | None = None
    effort: StrictStr | None = None


class _Conversation(_Body):
    """What both routes read: the model, the system prompt, the turns and the tools."""

    model: StrictStr = Field(min_length=1)
    messages: FastList[MessageParam] = Field(min_length=1)
    system: StrictStr | FastList[TextBlock] | None = None
    tools: FastList[Tool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    thinking: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    speed: StrictStr | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools_only(cls, value: Any) -> Any:
        """Server tools (``web_search_...``, ``bash_...``) are named in a clear 400."""
        for tool in value if isinstance(value, list) else []:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind not in (None, "custom"):
                raise ValueError(
                    f"the server tool {kind!r} is not supported; Conveyor offers client tools "
                    "(name, description, input_schema) that the caller runs"
                )
        return value

    @model_validator(mode="after")
    def _tools_fit(self) -> _Conversation:
        names = self.tool_names
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise ValueError(f"tool_choice of type {choice.type!r} needs tools")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names an unknown tool {choice.name!r}")
        return self

    @property
    def tool_names(self) -> tuple[str, ...]:
        """Names of the tools."""
        return tuple(tool.name for tool in self.tools or [])

    @property
    def system_text(self) -> str:
        """The system prompt as one string (blocks joined by newlines)."""
        if isinstance(self.system, list):
            return "\n".join(block.text for block in self.system)
        return self.system or ""

    def input_bytes(self) -> int:
        """Characters of text and schemas (large requests are prepared off the loop)."""
        total = len(self.system_text) + sum(_message_chars(m) for m in self.messages)
        for tool in self.tools or []:
            total += len(str(tool.input_schema))
        return total

    def text_bytes(self) -> int:
        """UTF-8 bytes of the text the prompt carries."""
        return utf8_size(self.system_text) + sum(
            utf8_size(message.text) for message in self.messages
        )

    @property
    def has_grammar(self) -> bool:
        """Whether a forced tool call or a JSON format constrains the reply."""
        if self.tool_choice is not None and self.tool_choice.type in ("any", "tool"):
            return True
        return self.output_config is not None and self.output_config.format is not None


def _message_chars(message: MessageParam) -> int:
    """About how many characters a turn carries (tool inputs and results included)."""
    if isinstance(message.content, str):
        return len(message.content)
    total = 0
    for block in message.content:
        if isinstance(block, TextBlock | ToolResultBlock):
            total += len(block.text)
        elif isinstance(block, ToolUseBlock):
            total += len(str(block.input))
    return total


class MessagesRequest(_Conversation):
    """``POST /v1/messages``: ``max_tokens`` is required, as in Anthropic's API."""

    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: FastList[StrictStr] | None = Field(default=None, max_length=MAX_STOP_STRINGS)
    stream: StrictBool = False
    temperature: Number | None = Field(default=None, ge=0, le=1)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    top_k: StrictInt | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    service_tier: StrictStr | None = None
    inference_geo: StrictStr | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not text for text in value):
            raise ValueError("stop sequences must not be empty")
        return value

    @property
    def include_usage(self) -> bool:
        """Streams always carry usage (``message_start`` and ``message_delta``)."""
        return True


class CountTokensRequest(_Conversation):
    """``POST /v1/messages/count_tokens``: the conversation without generation settings."""
