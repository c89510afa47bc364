"""The second KV tier as the engine thread uses it: the index, the store, and their counts.

After each ``schedule`` the engine calls :meth:`KVOffload.flush`: the copies the block
manager's decisions queued (spills of evicted blocks, restores of prefix hits) run before
the step's forward pass reads or overwrites those blocks. A copy that fails leaves
nothing trusted: the tier forgets everything, the restored pool blocks stop being served
from the cache, and the step fails (its requests get an error; the next ones recompute).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.kv_tier import Restore, Tier, TierIndex, TierOp
from conveyor.observability.metrics import GeneratorMetrics

__all__ = ["KVOffload", "KVTierStore", "TierStats", "tier_index"]


class _Moved(Protocol):
    """What a store reports after ``apply``."""

    by_direction: dict[str, int]


class KVTierStore(Protocol):
    """Where the tier's blocks live (``engine.model.kv_store.HostKVStore`` is one)."""

    block_bytes: int

    def apply(self, ops: list[TierOp]) -> _Moved:
        """Carry out ``ops`` in order; the bytes moved per direction."""

    def close(self) -> None:
        """Release what the store holds outside memory (its disk files)."""


@dataclass(slots=True)
class TierStats:
    """What the tier did since the engine started (engine thread writes, others read)."""

    hit_blocks: dict[str, int] = field(default_factory=lambda: {t.value: 0 for t in Tier})
    bytes_moved: dict[str, int] = field(default_factory=dict)
    num_failures: int = 0


class KVOffload:
    """A ``TierIndex`` (given to the block manager) and the store that holds its data."""

    def __init__(self, index: TierIndex, store: KVTierStore) -> None:
        """Pair an index with the store whose slots it numbers."""
        self.index = index
        self.store = store
        self.stats = TierStats()

    def flush(self, manager: BlockManager, metrics: GeneratorMetrics) -> None:
        """Carry out the queued copies; raises what the store raised, after forgetting
        everything the failed copies may have left half-written."""
        ops = self.index.take_ops()
        if not ops:
            return
        try:
            moved = self.store.apply(ops)
        except Exception:
            self.index.clear()
            manager.forget([op.block_id for op in ops if isinstance(op, Restore)])
            self.stats.num_failures += 1
            raise
        for op in ops:
            if isinstance(op, Restore):
                tier = op.tier.value
                self.stats.hit_blocks[tier] += 1
                metrics.kv_tier_hit_blocks[tier].inc()
        for direction, num_bytes in moved.by_direction.items():
            if num_bytes:
                totals = self.stats.bytes_moved
                totals[direction] = totals.get(direction, 0) + num_bytes
                metrics.kv_tier_bytes[direction].inc(num_bytes)

    def publish(self, metrics: GeneratorMetrics) -> None:
        """The gauges of blocks each tier holds."""
        metrics.kv_tier_blocks[Tier.HOST.value].set(self.index.num_host_blocks)
        metrics.kv_tier_blocks[Tier.DISK.value].set(self.index.num_disk_blocks)

    def close(self) -> None:
        """Release the store's disk files."""
        self.store.close()


def tier_index(offload: KVOffload | None) -> TierIndex | None:
    """The index a block manager keeps its evicted blocks in (None without a tier)."""
    return None if offload is None else offload.index
