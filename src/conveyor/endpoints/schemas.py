"""Request bodies as pydantic models (OpenAI's field names and types)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

from conveyor.endpoints.validation import FastList

# As a completions prompt: shapes tried in order, each list stopping at its first bad item.
EmbeddingInputField = Annotated[
    StrictStr | FastList[StrictInt] | FastList[StrictStr] | FastList[FastList[StrictInt]],
    Field(union_mode="left_to_right"),
]


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
        if isinstance(value[0], int):  # one input of ids (the union made them all ints)
            if min(value) < 0:  # C speed: no per-id Python loop over millions
                index = next(i for i, token in enumerate(value) if token < 0)
                raise ValueError(f"input[{index}] is a negative token id ({value[index]})")
            return value
        for index, item in enumerate(value):
            if not item:
                raise ValueError(f"input[{index}] must not be empty")
            if isinstance(item, list) and min(item) < 0:
                raise ValueError(f"input[{index}] holds a negative token id")
        return value

    def inputs(self) -> list[str | list[int]]:
        """The input normalised to a list of strings or token-id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [value]  # one input given as token ids
        return list(value)  # type: ignore[arg-type]


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: ``prompt`` (text) or ``messages`` (through the chat template)."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1)
    prompt: StrictStr | None = None
    messages: FastList[dict[str, Any]] | None = Field(default=None, min_length=1)
    tools: FastList[dict[str, Any]] | None = None
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
    tokens: FastList[StrictInt]
