"""Request bodies as pydantic models (OpenAI's field names and types)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

EmbeddingInputField = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``; ``truncate`` is Conveyor's extension."""

    # Unknown fields are refused, as on the generation endpoints: silently dropping one
    # could change the result without telling the caller.
    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1)
    input: EmbeddingInputField
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(default=None, ge=1)
    user: StrictStr | None = None
    truncate: bool = False

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: EmbeddingInputField) -> EmbeddingInputField:
        if isinstance(value, str):
            if not value:
                raise ValueError("input must not be an empty string")
            return value
        if not value:
            raise ValueError("input must not be an empty list")
        for index, item in enumerate(value):
            if isinstance(item, str | list) and len(item) == 0:
                raise ValueError(f"input[{index}] must not be empty")
            if isinstance(item, int) and item < 0:
                raise ValueError(f"input[{index}] is a negative token id ({item})")
            if isinstance(item, list) and any(token < 0 for token in item):
                raise ValueError(f"input[{index}] holds a negative token id")
        return value

    def inputs(self) -> list[str | list[int]]:
        """The input normalised to a list of strings or token-id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [[int(token) for token in value]]  # one input given as token ids
        return list(value)  # type: ignore[arg-type]


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: ``prompt`` (text) or ``messages`` (through the chat template)."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1)
    prompt: StrictStr | None = None
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: StrictBool | None = Field(
        default=None, description="Default: true for a prompt (the chat template adds its own)."
    )
    add_generation_prompt: StrictBool = Field(
        default=True, description="Only true: chats are tokenized as the chat endpoint sends them."
    )
    return_token_strs: StrictBool = False


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: token ids back to text."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1)
    tokens: list[StrictInt]
