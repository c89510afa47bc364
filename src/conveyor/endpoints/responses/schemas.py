"""The body of ``POST /v1/responses`` (OpenAI's ``CreateResponse``).

Every field of OpenAI's request is known here, in one of three kinds:

- used: ``model``, ``input``, ``instructions``, ``max_output_tokens``, ``temperature``,
  ``top_p``, ``tools`` (functions), ``tool_choice``, ``parallel_tool_calls``, ``text``
  (its ``format``), ``include`` (``message.output_text.logprobs``), ``top_logprobs``,
  ``metadata`` (kept with the response), ``store``, ``previous_response_id``,
  ``truncation``, ``stream``, ``background``, ``user`` (a gateway's session hint);
- accepted and ignored (``IGNORED_FIELDS``): reasoning settings, caching hints, service
  tier, safety identifiers, ``max_tool_calls`` (hosted tools only), ``stream_options``,
  ``client_metadata`` (which Codex CLI sends);
- refused when set (``UNSUPPORTED_FIELDS``): what needs a feature Conveyor does not have.

Any other field is a 400, as on the chat endpoint.
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

from conveyor.endpoints.responses.item_schemas import (
    AllowedTools,
    FunctionChoice,
    FunctionToolSpec,
    InputItem,
    TextConfig,
    ToolChoiceSpec,
    check_item_types,
    check_tool_choice,
    check_tool_types,
)
from conveyor.endpoints.validation import FastList

__all__ = ["IGNORED_FIELDS", "LOGPROBS_INCLUDE", "UNSUPPORTED_FIELDS", "ResponseRequest"]

# Accepted for compatibility; none of them changes what Conveyor produces.
IGNORED_FIELDS = (
    "reasoning", "service_tier", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "safety_identifier", "max_tool_calls", "stream_options",
    "client_metadata",
)  # fmt: skip
# Features Conveyor does not have: a 400 when one is asked for.
UNSUPPORTED_FIELDS = {
    "conversation": "conversations are not supported; continue with previous_response_id",
    "prompt": "stored prompt templates are not supported; send instructions and input",
    "context_management": "context management (compaction) is not supported",
    "moderation": "moderation is not supported",
}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MIN_OUTPUT_TOKENS = 16  # OpenAI's own lower bound
MAX_TOP_LOGPROBS = 20
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

Number = StrictFloat | StrictInt


class ResponseRequest(BaseModel):
    """``POST /v1/responses``; see the module docstring for what each field does."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1)
    input: StrictStr | FastList[InputItem]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=MIN_OUTPUT_TOKENS)
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: FastList[FunctionToolSpec] | None = None
    tool_choice: ToolChoiceSpec | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    include: FastList[StrictStr] | None = None
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = None
    store: StrictBool | None = None
    previous_response_id: StrictStr | None = Field(default=None, min_length=1)
    truncation: Literal["auto", "disabled"] | None = None
    stream: StrictBool | None = None
    background: StrictBool | None = None
    # Accepted and ignored (IGNORED_FIELDS).
    reasoning: dict[str, Any] | None = None
    service_tier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_retention: StrictStr | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: StrictStr | None = None
    max_tool_calls: StrictInt | None = None
    stream_options: dict[str, Any] | None = None
    # Sent by OpenAI's Codex CLI (request bookkeeping; not in OpenAI's published schema).
    client_metadata: dict[str, Any] | None = None
    # Refused when set (UNSUPPORTED_FIELDS).
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None
    moderation: Any = None

    _items = field_validator("input", mode="before")(check_item_types)
    _tools = field_validator("tools", mode="before")(check_tool_types)
    _choice = field_validator("tool_choice", mode="before")(check_tool_choice)

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if not value:
            raise ValueError("input must not be empty")
        return value

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata_limits(cls, value: Any) -> Any:
        """OpenAI's limits: 16 pairs, keys up to 64 characters, string values up to 512."""
        if not isinstance(value, dict):
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"metadata holds at most {MAX_METADATA_PAIRS} pairs")
        for key, item in value.items():
            if len(str(key)) > MAX_METADATA_KEY_CHARS:
                raise ValueError(f"metadata keys are at most {MAX_METADATA_KEY_CHARS} characters")
            if not isinstance(item, str) or len(item) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(
                    f"metadata values are strings of at most {MAX_METADATA_VALUE_CHARS} characters"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ResponseRequest:
        for name, why in UNSUPPORTED_FIELDS.items():
            if getattr(self, name) is not None:
                raise ValueError(f"{name}: {why}")
        if self.background and self.stream:
            raise ValueError(
                "a background response is not streamed here; poll GET /v1/responses/{id}"
            )
        if self.background and self.store is False:
            raise ValueError("a background response must be stored (store: true)")
        self._check_tool_choice()
        return self

    def _check_tool_choice(self) -> None:
        """The tool choice must name functions that are in ``tools``."""
        choice = self.tool_choice
        if choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        names = set(self.tool_names)
        if len(names) != len(self.tools or []):
            raise ValueError("tool names must be unique")
        chosen: tuple[str, ...] = (choice.name,) if isinstance(choice, FunctionChoice) else ()
        if isinstance(choice, AllowedTools):
            chosen = choice.names
        unknown = [name for name in chosen if name not in names]
        if unknown:
            raise ValueError(f"tool_choice names an unknown function {unknown[0]!r}")

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The functions in ``tools``."""
        return tuple(tool.name for tool in self.tools or [])

    @property
    def is_stored(self) -> bool:
        """``store``, true unless turned off (OpenAI's default)."""
        return self.store is not False

    @property
    def wants_logprobs(self) -> bool:
        """Whether ``include`` asks for the output text's logprobs."""
        return LOGPROBS_INCLUDE in (self.include or [])

    def input_bytes(self) -> int:
        """About how many characters of input the body carries (decides off-loop work)."""
        total = len(self.instructions or "")
        if isinstance(self.input, str):
            return total + len(self.input)
        for item in self.input:
            total += len(getattr(item, "text", "") or getattr(item, "arguments", ""))
        return total

    @property
    def has_grammar(self) -> bool:
        """Whether a JSON format or a forced tool call constrains the reply (its grammar is
        checked off the event loop)."""
        choice = self.tool_choice
        is_forced = choice == "required" or isinstance(choice, FunctionChoice)
        is_forced = is_forced or (isinstance(choice, AllowedTools) and choice.mode == "required")
        text_format = self.text.format if self.text is not None else None
        return is_forced or (text_format is not None and text_format.type != "text")
