"""The body of ``/v1/chat/completions``: messages, tools, response formats (OpenAI's shapes).

A response's ``message.model_dump()`` sent back as history must validate, so assistant
messages take ``tool_calls``, ``refusal``, ``annotations``, and null ``audio`` /
``function_call``; ``tool`` messages take ``tool_call_id``. Fields that change nothing
Conveyor does (``IGNORED_FIELDS``) are accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from conveyor.endpoints.generation_schemas import GenerationRequestBody, _Body
from conveyor.endpoints.validation import FastList
from conveyor.engine.sampling.params import MAX_LOGPROBS
from conveyor.input_limits import utf8_size

__all__ = [
    "IGNORED_FIELDS",
    "ChatCompletionRequest",
    "ChatMessage",
    "ContentPart",
    "FunctionTool",
    "ResponseFormat",
    "ToolCall",
]

# Accepted for compatibility; none of them changes the output Conveyor produces.
IGNORED_FIELDS = (
    "metadata", "store", "service_tier", "reasoning_effort", "verbosity",
    "prompt_cache_key", "safety_identifier", "user", "parallel_tool_calls",
)  # fmt: skip

_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class ContentPart(_Body):
    """One part of a message's content: ``text`` (or an assistant's ``refusal``)."""

    type: StrictStr
    text: StrictStr | None = None
    refusal: StrictStr | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type not in ("text", "refusal"):
            raise ValueError(f"content parts of type {self.type!r} are not supported; use 'text'")
        if self.type == "text" and self.text is None:
            raise ValueError("a text content part needs 'text'")
        return self

    @property
    def plain(self) -> str:
        """The part's text."""
        return (self.text if self.type == "text" else self.refusal) or ""


class FunctionCall(_Body):
    """A call's function: its name and JSON-encoded arguments."""

    name: StrictStr
    arguments: StrictStr


class ToolCall(_Body):
    """A tool call in an assistant message of the history."""

    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    """One chat message; content as a string or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | FastList[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: FastList[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    refusal: StrictStr | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None

    @model_validator(mode="after")
    def _fields_fit_the_role(self) -> ChatMessage:
        is_assistant = self.role == "assistant"
        if self.tool_calls and not is_assistant:
            raise ValueError("only assistant messages may have tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        if self.content is None and not (is_assistant and (self.tool_calls or self.refusal)):
            raise ValueError(f"a {self.role} message needs content")
        return self

    @property
    def text(self) -> str:
        """The content as one string (parts joined; a refusal when there is no content)."""
        content = self.content
        if isinstance(content, list):
            return "".join(part.plain for part in content)
        return content if content is not None else (self.refusal or "")


class FunctionDefinition(_Body):
    """A function the model may call: name, description and a JSON schema of arguments."""

    name: StrictStr = Field(pattern=_NAME_PATTERN)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class FunctionTool(_Body):
    """An entry of ``tools``; only functions exist."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    """The function a named ``tool_choice`` forces."""

    name: StrictStr


class NamedToolChoice(_Body):
    """``{"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Body):
    """``response_format.json_schema``: a named schema, strict or not."""

    name: StrictStr = Field(pattern=_NAME_PATTERN)
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Body):
    """``text``, ``json_object`` (any JSON object) or ``json_schema`` (that schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs 'json_schema'")
        return self


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatCompletionRequest(GenerationRequestBody):
    """``POST /v1/chat/completions``; audio, images and built-in tools are not supported."""

    messages: FastList[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: FastList[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    metadata: dict[str, StrictStr] | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    reasoning_effort: StrictStr | None = None
    verbosity: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    safety_identifier: StrictStr | None = None

    @field_validator("metadata", mode="before")
    @classmethod
    def _string_values(cls, value: Any) -> Any:
        """Checked before pydantic's own pass, so the first bad value ends it (see FastList)."""
        if isinstance(value, dict):
            bad = next((key for key, item in value.items() if not isinstance(item, str)), None)
            if bad is not None:
                raise ValueError(f"metadata values must be strings ({str(bad)[:24]!r} is not)")
        return value

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, value: list[FunctionTool] | None) -> list[FunctionTool] | None:
        names = [tool.function.name for tool in value or []]
        if len(set(names)) != len(names):
            raise ValueError("tool function names must be unique")
        return value

    @model_validator(mode="after")
    def _choice_names_a_tool(self) -> ChatCompletionRequest:
        choice = self.tool_choice
        if choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in self.tool_names:
            raise ValueError(f"tool_choice names an unknown function {choice.function.name!r}")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        return self

    @property
    def tool_names(self) -> tuple[str, ...]:
        """Names of the functions in ``tools``."""
        return tuple(tool.function.name for tool in self.tools or [])

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        """``tool_choice`` with OpenAI's defaults: ``auto`` with tools, ``none`` without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def input_bytes(self) -> int:
        """Characters of message text and schemas (large ones are prepared off the loop)."""
        total = sum(len(message.text) for message in self.messages)
        for tool in self.tools or []:
            total += len(str(tool.function.parameters or ""))
        if self.response_format is not None and self.response_format.json_schema is not None:
            total += len(str(self.response_format.json_schema.schema_ or ""))
        return total

    def text_bytes(self) -> int:
        """UTF-8 bytes of the message text (what ``max_input_bytes`` bounds)."""
        return sum(utf8_size(message.text) for message in self.messages)

    @property
    def has_grammar(self) -> bool:
        """Whether a JSON ``response_format`` or a forced ``tool_choice`` constrains the reply."""
        choice = self.effective_tool_choice
        if choice == "required" or isinstance(choice, NamedToolChoice):
            return True
        return self.response_format is not None and self.response_format.type != "text"

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens``, else the older ``max_tokens``; None: fill the context."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """Alternatives per token to report (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None
