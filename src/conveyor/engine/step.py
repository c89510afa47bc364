"""The contract between the scheduler's decisions and the model runner.

Kept free of torch so both sides can import it.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def end_pos(self) -> int:
        """Position one past the last token computed in this chunk."""
        return self.start_pos + len(self.token_ids)
