"""Request bodies of ``/v1/completions`` and what chat shares with it (OpenAI's fields).

Unknown fields are refused rather than ignored: a sampling option we silently dropped
would change the output without telling the caller. ``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos`` and ``stop_token_ids`` are vLLM's extensions.
The chat body is in ``chat_schemas``.
"""

from __future__ import annotations

from typing import Annotated, Any

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

from conveyor.endpoints.validation import FastList
from conveyor.engine.sampling.params import MAX_LOGPROBS

__all__ = [
    "MAX_CHOICES",
    "MAX_STOP_STRINGS",
    "CompletionRequest",
    "GenerationRequestBody",
    "StreamOptions",
]

MAX_STOP_STRINGS = 4
MAX_CHOICES = 128
MAX_SEED = 2**63 - 1
DEFAULT_COMPLETION_MAX_TOKENS = 16

# A token id key of logit_bias: vocabularies are far below 10**10 ids.
MAX_TOKEN_ID_DIGITS = 10

Number = StrictFloat | StrictInt
# Tried in order, each list stopping at its first bad item: a megabyte of the wrong kind is
# refused after a few checks (smart mode validated every item against every shape).
PromptField = Annotated[
    StrictStr | FastList[StrictInt] | FastList[StrictStr] | FastList[FastList[StrictInt]],
    Field(union_mode="left_to_right"),
]


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
    n: StrictInt | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stop: StrictStr | FastList[StrictStr] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=MAX_SEED)
    presence_penalty: Number | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: Number | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, Number] | None = None
    user: StrictStr | None = None
    top_k: StrictInt | None = Field(default=None, ge=-1)
    min_p: Number | None = Field(default=None, ge=0, le=1)
    repetition_penalty: Number | None = Field(default=None, gt=0, le=10)
    ignore_eos: StrictBool = False
    stop_token_ids: FastList[StrictInt] | None = None

    def input_bytes(self) -> int:
        """About how many bytes of input this request carries (decides off-loop work)."""
        return 0

    @property
    def has_grammar(self) -> bool:
        """Whether the output is constrained by a grammar (checked off the loop)."""
        return False

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else value or []
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
        if any(not text for text in strings):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_entries(cls, value: Any) -> Any:
        """Checked before pydantic's own pass, so the first bad entry ends it (see FastList)."""
        if not isinstance(value, dict):
            return value
        for key, bias in value.items():
            if not _is_token_id_key(key):
                raise ValueError(
                    f"logit_bias keys must be token ids (1 to {MAX_TOKEN_ID_DIGITS} ASCII "
                    f"digits), got {str(key)[:24]!r}"
                )
            if isinstance(bias, bool) or not isinstance(bias, int | float):
                raise ValueError(f"logit_bias values must be numbers, got {str(bias)[:24]!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be between -100 and 100, got {bias}")
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
    def num_choices(self) -> int:
        """Choices per prompt (``n``)."""
        return self.n or 1

    def logit_bias_pairs(self) -> list[tuple[int, float]]:
        """``logit_bias`` as (token id, bias) pairs."""
        return [(int(key), float(bias)) for key, bias in (self.logit_bias or {}).items()]

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    def stop_strings(self) -> list[str]:
        """``stop`` as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def _is_token_id_key(key: object) -> bool:
    """Whether a logit_bias key spells a token id in ASCII digits.

    ``str.isdigit`` alone also accepts superscripts (which ``int`` refuses) and other
    scripts' digits (which ``int`` reads: Arabic-Indic "١٢" would bias token 12).
    """
    if not isinstance(key, str):
        return False
    return 0 < len(key) <= MAX_TOKEN_ID_DIGITS and key.isascii() and key.isdigit()


class CompletionRequest(GenerationRequestBody):
    """``POST /v1/completions``; ``prompt`` may hold several prompts (one choice each)."""

    prompt: PromptField
    # 0 runs the prompt only: with echo and logprobs, for the prompt tokens' logprobs.
    max_tokens: StrictInt | None = Field(default=DEFAULT_COMPLETION_MAX_TOKENS, ge=0)
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
            if isinstance(value[0], int):
                return value  # one prompt of ids: no per-id loop over millions here
            for index, item in enumerate(value):
                if not item:
                    raise ValueError(f"prompt[{index}] must not be empty")
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
            return [value]  # the union made every item an int
        return list(value)  # type: ignore[arg-type]

    def input_bytes(self) -> int:
        """Characters of text plus 4 bytes per token id, over every prompt."""
        return sum(len(p) if isinstance(p, str) else 4 * len(p) for p in self.prompts())
