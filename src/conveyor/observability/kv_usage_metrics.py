"""The KV-cache gauges (blocks used, blocks free, the used share), from one snapshot.

Three plain gauges set one after the other tear: a scrape that falls between two sets
reads the blocks used before a step and the blocks free after it. Here the engine sets a
model's three figures in one assignment, and a scrape takes each model's figures once,
so every scrape shows used + free equal to the cache's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["KVUsage", "KVUsageFamilies", "KVUsageSnapshot"]

# Each family: its name, its help, and the snapshot's attribute it shows.
FAMILIES = (
    ("conveyor_kv_blocks_used", "KV-cache blocks held by sequences", "used"),
    ("conveyor_kv_blocks_free", "KV-cache blocks free (cached prefixes included)", "free"),
    ("conveyor_kv_cache_usage_ratio", "Share of KV-cache blocks held (0..1)", "ratio"),
)


class KVUsageSnapshot(NamedTuple):
    """One model's KV-cache figures at one moment."""

    used: int
    free: int
    total: int

    @property
    def ratio(self) -> float:
        """The share of the cache's blocks held (0 for a cache of no blocks)."""
        return self.used / max(1, self.total)


class KVUsage:
    """One model's KV-cache gauges: ``set`` replaces all three figures at once."""

    def __init__(self, snapshots: dict[str, KVUsageSnapshot], model: str) -> None:
        self._snapshots = snapshots
        self._model = model
        snapshots.setdefault(model, KVUsageSnapshot(0, 0, 0))

    def set(self, used: int, free: int, total: int) -> None:
        """The blocks held, the blocks free and the cache's size, after a step."""
        self._snapshots[self._model] = KVUsageSnapshot(used, free, total)


class KVUsageFamilies(Collector):
    """The three KV-cache families of every generative model, labelled by model."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._snapshots: dict[str, KVUsageSnapshot] = {}
        registry.register(self)

    def labels(self, model: str) -> KVUsage:
        """``model``'s gauges (zeros until its engine first sets them)."""
        return KVUsage(self._snapshots, model)

    def snapshots(self) -> dict[str, KVUsageSnapshot]:
        """Each model's figures as last set, taken once."""
        return dict(self._snapshots)

    def describe(self) -> list[Any]:
        """The families' names, with no samples."""
        return [GaugeMetricFamily(name, text, labels=["model"]) for name, text, _ in FAMILIES]

    def collect(self) -> Iterator[Any]:
        """The three families, all from one snapshot of every model."""
        snapshots = sorted(self.snapshots().items())
        for name, text, figure in FAMILIES:
            family = GaugeMetricFamily(name, text, labels=["model"])
            for model, snapshot in snapshots:
                family.add_metric([model], float(getattr(snapshot, figure)))
            yield family
