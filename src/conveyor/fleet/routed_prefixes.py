"""What this gateway routed where: the prompt blocks it sent each worker, LRU-bounded.

A worker reports the blocks its cache holds in its heartbeat, so a follow-up turn that
arrives before the next heartbeat (an agent with no think time) would be routed by load.
The gateway therefore also remembers the prompt-block keys of every request it routed,
per worker, and treats them as held until they age out of a bounded LRU (``max_blocks``
per worker) or the worker leaves the registry. Two gateways each know only their own
traffic; the reported holdings stay the truth both share.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from conveyor.prefix.report import PrefixHoldings

__all__ = ["MergedHoldings", "RoutedPrefixes"]

# (model, block size, digest key) of one routed block.
_Entry = tuple[str, int, bytes]


class RoutedPrefixes:
    """Per worker, the prompt-block keys routed to it, least recently routed first."""

    def __init__(self, max_blocks: int) -> None:
        """Keep at most ``max_blocks`` keys per worker (>= 1)."""
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._by_worker: dict[str, OrderedDict[_Entry, None]] = {}

    def num_blocks(self, worker_id: str) -> int:
        """Keys remembered for ``worker_id``."""
        return len(self._by_worker.get(worker_id, ()))

    def record(self, worker_id: str, model: str, block_size: int, keys: Sequence[bytes]) -> None:
        """A request of ``model`` whose prompt blocks are ``keys`` went to ``worker_id``."""
        if not keys:
            return
        entries = self._by_worker.setdefault(worker_id, OrderedDict())
        for key in keys[: self.max_blocks]:  # matches count from the head
            entry = (model, block_size, key)
            if entry in entries:
                entries.move_to_end(entry)
            else:
                entries[entry] = None
        while len(entries) > self.max_blocks:
            entries.popitem(last=False)

    def holds(self, worker_id: str, model: str, block_size: int, key: bytes) -> bool:
        """Whether ``key`` was routed to ``worker_id`` and not yet aged out."""
        entries = self._by_worker.get(worker_id)
        return entries is not None and (model, block_size, key) in entries

    def forget_missing(self, present_ids: Collection[str]) -> None:
        """Drop the workers the registry no longer lists (with their keys)."""
        for worker_id in [w for w in self._by_worker if w not in present_ids]:
            del self._by_worker[worker_id]


@dataclass(frozen=True, slots=True)
class _UnionKeys:
    """Keys a worker reported, or this gateway routed there."""

    reported: frozenset[bytes]
    routed: RoutedPrefixes
    worker_id: str
    model: str
    block_size: int

    def __contains__(self, key: object) -> bool:
        if key in self.reported:
            return True
        return isinstance(key, bytes) and self.routed.holds(
            self.worker_id, self.model, self.block_size, key
        )


@dataclass(frozen=True, slots=True)
class MergedHoldings:
    """A worker's reported holdings for a model, widened by what was routed there."""

    block_size: int
    keys: _UnionKeys

    @classmethod
    def of(
        cls, reported: PrefixHoldings, routed: RoutedPrefixes, worker_id: str, model: str
    ) -> MergedHoldings:
        """The union of ``reported`` and ``routed``'s keys for this worker and model."""
        size = reported.block_size
        return cls(size, _UnionKeys(reported.keys, routed, worker_id, model, size))
