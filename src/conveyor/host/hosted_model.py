"""A loaded one-shot model and how a request's inputs reach its batcher: limits, encoding, queueing.

The request side of `Service.embed` and `Service.score_pairs`: all or none of a request's
inputs are queued on the model's batcher, and a caller that leaves drops what has not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.batching.batcher import Batcher
from conveyor.batching.item import WorkItem
from conveyor.config.model_config import (
    EmbeddingModelConfig,
    RerankModelConfig,
    SyntheticModelConfig,
)
from conveyor.errors import InvalidRequest
from conveyor.host.offload import run_sized
from conveyor.input_limits import check_text_bytes, cut_to_bytes, input_byte_limit, utf8_size
from conveyor.models.base import EmbeddingInput, EmbeddingModel, EncodedInput
from conveyor.observability.metrics import ModelMetrics
from conveyor.priority import Priority

OneShotConfig = SyntheticModelConfig | EmbeddingModelConfig | RerankModelConfig

_SHORTEN = 'shorten it or send "truncate": true'


@dataclass(slots=True)
class HostedModel:
    """A loaded one-shot model, its config, its batcher and its metric children."""

    config: OneShotConfig
    model: EmbeddingModel
    batcher: Batcher
    metrics: ModelMetrics
    created_at: int

    def text_byte_limit(self) -> int:
        """The model's ``max_input_bytes`` (default: its token limit times the bytes a token)."""
        return input_byte_limit(self.config.max_input_bytes, self.model.max_input_tokens)

    def check_inputs(self, inputs: Sequence[object], dimensions: int | None) -> None:
        """Limits that depend on the model: the dimensions asked for, inputs per request."""
        if dimensions is not None and dimensions > self.model.dim:
            raise InvalidRequest(
                f"model {self.config.name!r} returns {self.model.dim} dimensions; "
                f"it cannot return {dimensions} (fewer are truncated and renormalised)",
                param="dimensions",
            )
        # Config validation keeps max_inputs_per_request <= max_queue, so a request under the
        # limit can always be queued on an idle model: over it is a 400, never a retryable 429.
        limit = self.config.input_limit
        if len(inputs) > limit:
            raise InvalidRequest(f"too many inputs: {len(inputs)} (at most {limit})", param="input")

    async def encode_inputs(
        self, inputs: Sequence[EmbeddingInput], truncate: bool
    ) -> list[EncodedInput]:
        """Tokenize every input once (off the event loop when large, ``run_sized``).

        Texts over ``max_input_bytes`` are refused, or with ``truncate`` cut, before that.
        """
        limit = self.text_byte_limit()
        inputs = [_bounded(item, limit, truncate, f"input[{i}]") for i, item in enumerate(inputs)]
        return await run_sized(input_bytes(inputs), self.model.encode, inputs, truncate=truncate)

    async def encode_pairs(
        self, pairs: Sequence[tuple[str, str]], truncate: bool
    ) -> list[EncodedInput]:
        """Tokenize rerank pairs once (off the loop when large); 400 for a model of another kind.

        Pairs over ``max_input_bytes`` are refused, or with ``truncate`` cut, before that.
        """
        encode = getattr(self.model, "encode_pairs", None)
        if encode is None:
            raise InvalidRequest(
                f"the model {self.config.name!r} is not a rerank model", param="model"
            )
        pairs = self._bounded_pairs(pairs, truncate)
        num_chars = sum(len(query) + len(document) for query, document in pairs)
        encoded: list[EncodedInput] = await run_sized(num_chars, encode, pairs, truncate=truncate)
        return encoded

    def _bounded_pairs(
        self, pairs: Sequence[tuple[str, str]], truncate: bool
    ) -> list[tuple[str, str]]:
        """Rerank pairs within ``max_input_bytes`` (query and document together), or a 400.

        With ``truncate`` the document gives way first, as ``longest_first`` truncation would.
        """
        limit = self.text_byte_limit()
        bounded = []
        for index, (query, document) in enumerate(pairs):
            size = utf8_size(query) + utf8_size(document)
            if size > limit and truncate:
                query = cut_to_bytes(query, limit)
                document = cut_to_bytes(document, max(0, limit - utf8_size(query)))
            else:
                check_text_bytes(size, limit, subject=f"pair {index}", param="documents",
                                 hint=_SHORTEN)  # fmt: skip
            bounded.append((query, document))
        return bounded

    def admit_encoded(
        self, encoded: Sequence[EncodedInput], priority: Priority, timeout_ms: float | None
    ) -> tuple[list[WorkItem], int]:
        """Queue every encoded input (all or none); returns the items and token count."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_ms or self.config.timeout_ms) / 1000
        items: list[WorkItem] = []
        try:
            for enc in encoded:
                items.append(self.batcher.submit(enc.payload, enc.num_tokens, priority, deadline))
        except BaseException:
            for item in items:
                self.batcher.abandon(item)
            raise
        return items, sum(enc.num_tokens for enc in encoded)

    async def gather_items(self, items: list[WorkItem]) -> list[Any]:
        """Await every item's result; if the awaiting is cancelled, drop what has not run."""
        try:
            if len(items) == 1:
                return [await items[0].future]
            return list(await asyncio.gather(*(item.future for item in items)))
        except BaseException:
            for item in items:
                self.batcher.abandon(item)
                item.future.add_done_callback(_consume_outcome)
            raise


def _bounded(item: EmbeddingInput, limit: int, truncate: bool, subject: str) -> EmbeddingInput:
    """A text input within ``limit`` bytes: cut when truncating, else a 400 if over."""
    if not isinstance(item, str):
        return item
    if truncate:
        return cut_to_bytes(item, limit)
    check_text_bytes(utf8_size(item), limit, subject=subject, param="input", hint=_SHORTEN)
    return item


def input_bytes(inputs: Sequence[EmbeddingInput]) -> int:
    """About how many bytes of input: characters of text, 4 bytes per token id."""
    return sum(len(item) if isinstance(item, str) else 4 * len(item) for item in inputs)


def _consume_outcome(future: asyncio.Future[Any]) -> None:
    """Mark a result nobody will read as retrieved (no 'never retrieved' noise)."""
    if not future.cancelled():
        future.exception()
