"""The engine's prefix digest: which cached KV blocks it holds, for the worker's heartbeat.

The block manager belongs to the engine thread, so that thread takes the snapshot (after a
step, at most every ``interval_s`` while busy, and always when it goes idle) and any other
thread reads the last one: a tuple, replaced whole, never mutated.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from conveyor.engine.core.block_manager import BlockManager

__all__ = ["DEFAULT_DIGEST_BLOCKS", "PrefixDigest"]

# 1,024 block keys of 8 bytes: about 11 KiB of base64 per model per heartbeat, and with
# 16-token blocks the heads of many sessions' prompts.
DEFAULT_DIGEST_BLOCKS = 1024


class PrefixDigest:
    """A bounded snapshot of the block hashes the prefix cache can serve."""

    def __init__(
        self,
        max_blocks: int = DEFAULT_DIGEST_BLOCKS,
        *,
        interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_blocks < 0:
            raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
        self.max_blocks = max_blocks
        self.interval_s = interval_s
        self._clock = clock
        self._taken_at: float | None = None
        self._hashes: tuple[bytes, ...] = ()

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """The last snapshot, most useful blocks first (any thread)."""
        return self._hashes

    def refresh(self, manager: BlockManager, *, force: bool = False) -> None:
        """Take a new snapshot unless one was taken less than ``interval_s`` ago."""
        now = self._clock()
        if not force and self._taken_at is not None and now - self._taken_at < self.interval_s:
            return
        self._taken_at = now
        self._hashes = tuple(manager.cached_hashes(self.max_blocks))
