"""Request bodies of ``/v1/rerank`` (Cohere/Jina shape) and ``/v1/score`` (vLLM's)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from conveyor.endpoints.validation import FastList


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1)
    truncate: StrictBool = Field(
        default=False, description="Cut pairs over the model's limit instead of a 400."
    )


class RerankDocument(BaseModel):
    """A document given as an object (Cohere's older shape)."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr


class RerankRequest(_Body):
    """``POST /v1/rerank``: score each document against the query, best first."""

    query: StrictStr = Field(min_length=1)
    documents: FastList[StrictStr | RerankDocument] = Field(min_length=1)
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = True

    def texts(self) -> list[str]:
        """The documents as plain strings."""
        return [doc if isinstance(doc, str) else doc.text for doc in self.documents]


class ScoreRequest(_Body):
    """``POST /v1/score``: one text against many (or pairwise, lists of equal length)."""

    text_1: StrictStr | FastList[StrictStr] = Field(min_length=1)
    text_2: StrictStr | FastList[StrictStr] = Field(min_length=1)

    def pairs(self) -> list[tuple[str, str]]:
        """(text_1, text_2) pairs: one against each, or zipped; ValueError if lengths differ."""
        first = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        second = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if len(first) == 1:
            return [(first[0], text) for text in second]
        if len(first) != len(second):
            raise ValueError(
                f"text_1 has {len(first)} texts and text_2 {len(second)}: give one text_1 "
                "or lists of the same length"
            )
        return list(zip(first, second, strict=True))
