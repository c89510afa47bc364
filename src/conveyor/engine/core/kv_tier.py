"""The second KV tier's bookkeeping: which evicted blocks host memory (and disk) still hold.

When the block manager hands a cached block out for new content, its keys and values
need not be lost: the block is spilled to a slot of a bounded host-memory store, keyed by
its chained block hash, and a later prompt with that prefix gets the block copied back
instead of recomputed. An optional disk tier takes what host memory evicts, up to a cap.

This index decides; it moves no data. Every decision is also queued as an operation
(``Spill``, ``Demote``, ``Restore``, ``Discard``), and the engine hands the queue to the
store (``engine.model.kv_store``) before the step runs, in decision order, which keeps
each copy ahead of whatever later overwrites its source. Entries a prefix lookup is about
to restore are pinned, so the spills that lookup causes never evict them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

__all__ = ["Demote", "Discard", "Restore", "Spill", "Tier", "TierIndex", "TierOp"]


class Tier(Enum):
    """Where a restored block came from."""

    HOST = "host"
    DISK = "disk"


@dataclass(frozen=True, slots=True)
class Spill:
    """Copy device block ``block_id`` into host slot ``slot``."""

    block_id: int
    slot: int


@dataclass(frozen=True, slots=True)
class Demote:
    """Write host slot ``slot`` to disk under ``digest`` (before the slot is reused)."""

    slot: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class Restore:
    """Copy the block ``digest`` into device block ``block_id``: from host slot ``slot``,
    or from disk when ``slot`` is None."""

    block_id: int
    slot: int | None
    digest: bytes

    @property
    def tier(self) -> Tier:
        """The tier the block comes from."""
        return Tier.DISK if self.slot is None else Tier.HOST


@dataclass(frozen=True, slots=True)
class Discard:
    """Delete the disk copy of ``digest``."""

    digest: bytes


TierOp = Spill | Demote | Restore | Discard


class TierIndex:
    """Host slots (LRU) and disk entries (LRU, optional) by block hash, and the queued ops."""

    def __init__(self, host_blocks: int, disk_blocks: int = 0) -> None:
        """``host_blocks`` slots in host memory (>= 1); ``disk_blocks`` on disk (0: none)."""
        if host_blocks < 1:
            raise ValueError(f"host_blocks must be >= 1, got {host_blocks}")
        if disk_blocks < 0:
            raise ValueError(f"disk_blocks must be >= 0, got {disk_blocks}")
        self.host_blocks = host_blocks
        self.disk_blocks = disk_blocks
        # Insertion order is eviction order: least recently used first.
        self._host: OrderedDict[bytes, int] = OrderedDict()
        self._free_slots = list(range(host_blocks - 1, -1, -1))
        self._disk: OrderedDict[bytes, None] = OrderedDict()
        self._pinned: set[bytes] = set()
        self._ops: list[TierOp] = []

    @property
    def num_host_blocks(self) -> int:
        """Blocks held in host memory."""
        return len(self._host)

    @property
    def num_disk_blocks(self) -> int:
        """Blocks held on disk."""
        return len(self._disk)

    def __contains__(self, digest: object) -> bool:
        """Whether either tier holds the block ``digest`` (no LRU change)."""
        return digest in self._host or digest in self._disk

    def hashes(self, limit: int) -> list[bytes]:
        """Up to ``limit`` held hashes, host first, the most recently used first."""
        found: list[bytes] = []
        for source in (self._host, self._disk):
            for digest in reversed(source):
                if len(found) >= limit:
                    return found
                if digest not in self._host or source is self._host:
                    found.append(digest)
        return found

    def take_ops(self) -> list[TierOp]:
        """The operations queued since the last call, in decision order."""
        ops, self._ops = self._ops, []
        return ops

    def clear(self) -> None:
        """Forget every block (after a failed copy: nothing held can be trusted)."""
        self._host.clear()
        self._disk.clear()
        self._free_slots = list(range(self.host_blocks - 1, -1, -1))
        self._ops.clear()

    @contextmanager
    def pinned(self, digests: Iterable[bytes]) -> Iterator[None]:
        """Keep ``digests`` from being evicted inside the block (a lookup restoring them)."""
        pins = set(digests) - self._pinned
        self._pinned |= pins
        try:
            yield
        finally:
            self._pinned -= pins

    def spill(self, block_id: int, digest: bytes) -> None:
        """Device block ``block_id`` holding ``digest`` is being reused: keep a copy.

        A block host memory already holds is only marked recently used. With every slot
        pinned the block is dropped (the tier is a cache: losing a block costs a recompute).
        """
        if digest in self._host:
            self._host.move_to_end(digest)
            return
        slot = self._free_slot()
        if slot is None:
            return
        self._host[digest] = slot
        self._ops.append(Spill(block_id, slot))

    def restore(self, digest: bytes, block_id: int) -> Tier:
        """Queue the copy of held block ``digest`` into device block ``block_id``.

        Raises KeyError for a block neither tier holds (check ``in`` first).
        """
        slot = self._host.get(digest)
        if slot is not None:
            self._host.move_to_end(digest)
        elif digest in self._disk:
            self._disk.move_to_end(digest)
        else:
            raise KeyError(digest.hex())
        op = Restore(block_id, slot, digest)
        self._ops.append(op)
        return op.tier

    def _free_slot(self) -> int | None:
        """A host slot for a new block: a free one, else the least recently used unpinned
        one (its block goes to disk when there is a disk tier); None if all are pinned."""
        if self._free_slots:
            return self._free_slots.pop()
        victim = next((d for d in self._host if d not in self._pinned), None)
        if victim is None:
            return None
        slot = self._host.pop(victim)
        if self.disk_blocks and victim not in self._disk and self._make_disk_room():
            self._disk[victim] = None
            self._ops.append(Demote(slot, victim))
        return slot

    def _make_disk_room(self) -> bool:
        """Discard least recently used unpinned disk blocks until one more fits."""
        while len(self._disk) >= self.disk_blocks:
            victim = next((d for d in self._disk if d not in self._pinned), None)
            if victim is None:
                return False
            del self._disk[victim]
            self._ops.append(Discard(victim))
        return True
