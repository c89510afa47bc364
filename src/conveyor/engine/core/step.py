"""The contract between the engine and the model runner: chunks in, logits out.

The scheduler decides (``ScheduledSeq``); each decision is frozen into a ``SeqChunk``;
a ``StepExecutor`` (``ModelRunner``, or a test's fake) computes a step of them. Kept
free of torch at run time so both sides can import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from conveyor.engine.outputs import TokenLogprobs

if TYPE_CHECKING:  # named in annotations only
    import torch

__all__ = [
    "PrepareTimed",
    "PromptScoring",
    "ScoresPrompts",
    "SeqChunk",
    "StepExecutor",
    "WarmsRowBuckets",
]


@dataclass(slots=True, frozen=True)
class PromptScoring:
    """Positions of a chunk whose next-token logprobs the caller wants (prompt logprobs).

    Position ``first_pos + i`` is scored against ``target_ids[i]``, the token that follows
    it, with the ``num_top`` most likely tokens there.
    """

    first_pos: int
    target_ids: tuple[int, ...]
    num_top: int = 0

    @property
    def end_pos(self) -> int:
        """Position one past the last scored one."""
        return self.first_pos + len(self.target_ids)


@dataclass(slots=True, frozen=True)
class SeqChunk:
    """One sequence's share of an engine step.

    The runner computes keys/values for ``token_ids`` at positions
    ``start_pos .. start_pos + len(token_ids) - 1``, writes them into the
    sequence's blocks, and attends over every position ``< start_pos +
    len(token_ids)`` already in the cache (prefix-cache hits and earlier
    chunks included).
    """

    token_ids: tuple[int, ...]
    start_pos: int
    block_table: tuple[int, ...]
    needs_logits: bool
    # The sequence's LoRA adapter (0: the base model alone).
    adapter_id: int = 0
    # Positions to score for prompt logprobs (None: none, and no cost).
    scoring: PromptScoring | None = None

    @property
    def end_pos(self) -> int:
        """Position one past the last token computed in this chunk."""
        return self.start_pos + len(self.token_ids)


class StepExecutor(Protocol):
    """What the engine needs from a model runner (``ModelRunner`` is one)."""

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Token ids that end a sequence."""

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """Run one step; logits [chunks needing logits, vocab] in chunk order."""


@runtime_checkable
class ScoresPrompts(Protocol):
    """An executor that scores prompt positions (``SeqChunk.scoring``) as it runs a step."""

    @property
    def last_prompt_scores(self) -> Sequence[tuple[TokenLogprobs, ...]]:
        """One entry per chunk of the last ``execute`` that had ``scoring``, in chunk
        order: a ``TokenLogprobs`` per scored position (the target token's logprob)."""


@runtime_checkable
class PrepareTimed(Protocol):
    """An executor that says how much of its last ``execute`` went to packing inputs."""

    @property
    def last_prepare_s(self) -> float:
        """Seconds the last ``execute`` spent building its inputs, before the model ran."""


@runtime_checkable
class WarmsRowBuckets(Protocol):
    """An executor that pads steps to row buckets and can prepare them all before the
    first request (``ModelRunner``; see ``engine.model.row_buckets``)."""

    def warm_row_buckets(self, max_rows: int) -> int:
        """Prepare every bucket of steps up to ``max_rows`` rows; returns how many."""
