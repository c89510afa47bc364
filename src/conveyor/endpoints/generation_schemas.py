"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions`` (OpenAI's fields).

Unknown fields are refused rather than ignored: a sampling option we silently dropped
(``repetition_penalty``, say) would change the output without telling the caller. OpenAI
options we accept but cannot honour beyond their neutral value (``n``, penalties,
``logit_bias``, tools) are refused with a message that says so.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from conveyor.engine.sampling_params import MAX_LOGPROBS

__all__ = [
    "MAX_STOP_STRINGS",
    "PROMPT_HINT",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "GenerationRequestBody",
    "StreamOptions",
]

MAX_STOP_STRINGS = 4
MAX_SEED = 2**63 - 1
DEFAULT_COMPLETION_MAX_TOKENS = 16

PROMPT_HINT = (
    "'prompt' must be a string, an array of strings, an array of token ids (integers) "
    "or an array of arrays of token ids"
)

Number = StrictFloat | StrictInt
PromptField = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class _Body(BaseModel):
    """Base of every body: unknown fields are errors (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    """``stream_options``: only ``include_usage`` changes anything."""

    include_usage: StrictBool = False
    include_obfuscation: StrictBool | None = None


class GenerationRequestBody(_Body):
    """Fields both endpoints share; ``top_k``, ``ignore_eos``, ``stop_token_ids`` are ours."""

    model: StrictStr = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    n: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    top_k: StrictInt | None = Field(default=None, ge=-1)
    ignore_eos: StrictBool = False
    stop_token_ids: list[StrictInt] | None = None

    def input_bytes(self) -> int:
        """About how many bytes of input this request carries (decides off-loop work)."""
        return 0

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError("only n=1 is supported (one choice per prompt)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else value or []
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
        if any(not text for text in strings):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported; only 0 is accepted")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(token < 0 for token in value):
            raise ValueError("token ids must be >= 0")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> GenerationRequestBody:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    def stop_strings(self) -> list[str]:
        """``stop`` as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(GenerationRequestBody):
    """``POST /v1/completions``; ``prompt`` may hold several prompts (one choice each)."""

    prompt: PromptField
    max_tokens: StrictInt | None = Field(default=DEFAULT_COMPLETION_MAX_TOKENS, ge=1)
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: PromptField) -> PromptField:
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be an empty list")
            for index, item in enumerate(value):
                if isinstance(item, str | list) and len(item) == 0:
                    raise ValueError(f"prompt[{index}] must not be empty")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError("only best_of=1 is supported")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompt normalised to a list of texts or token-id lists."""
        value = self.prompt
        if isinstance(value, str):
            return [value]
        if isinstance(value[0], int):
            return [[int(token) for token in value]]  # type: ignore[arg-type]
        return list(value)  # type: ignore[arg-type]

    def input_bytes(self) -> int:
        """Characters of text plus 4 bytes per token id, over every prompt."""
        return sum(len(p) if isinstance(p, str) else 4 * len(p) for p in self.prompts())


class ContentPart(_Body):
    """One part of a message's content; only text parts are supported."""

    type: StrictStr
    text: StrictStr | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type != "text":
            raise ValueError(f"content parts of type {self.type!r} are not supported; use 'text'")
        if self.text is None:
            raise ValueError("a text content part needs 'text'")
        return self


class ChatMessage(_Body):
    """One chat message; content as a string or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def to_template(self) -> dict[str, Any]:
        """The plain ``{"role", "content"}`` dict chat templates expect."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content)
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(GenerationRequestBody):
    """``POST /v1/chat/completions``; tools, audio and images are not supported."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, StrictStr] | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tools are not supported")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none"):
            raise ValueError("tool_choice is not supported")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "text":
            raise ValueError("only response_format {'type': 'text'} is supported")
        return value

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        return self

    def input_bytes(self) -> int:
        """Characters of message text over the whole conversation."""
        total = 0
        for message in self.messages:
            content = message.content
            if isinstance(content, str):
                total += len(content)
            elif content is not None:
                total += sum(len(part.text or "") for part in content)
        return total

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
