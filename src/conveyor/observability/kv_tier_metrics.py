"""The second KV tier's metric families (``engine.kv_offload`` counts into them)."""

from __future__ import annotations

from typing import Any, TypedDict

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["KV_TIERS", "KV_TIER_DIRECTIONS", "KVTierChildren", "KVTierFamilies"]

# Where restored blocks come from, and the directions the tier's bytes move in.
KV_TIERS = ("host", "disk")
KV_TIER_DIRECTIONS = ("device_to_host", "host_to_device", "host_to_disk", "disk_to_device")


class KVTierChildren(TypedDict):
    """One model's children of the tier's families (fields of ``GeneratorMetrics``)."""

    kv_tier_hit_blocks: dict[str, Any]
    kv_tier_bytes: dict[str, Any]
    kv_tier_blocks: dict[str, Any]


class KVTierFamilies:
    """Blocks restored per tier, bytes moved per direction, blocks held per tier."""

    def __init__(self, reg: CollectorRegistry) -> None:
        self.hit_blocks = Counter(
            "conveyor_kv_tier_hit_blocks_total",
            "KV blocks copied back from the second tier instead of recomputed, by tier "
            "(host|disk)", ["model", "tier"], registry=reg,
        )  # fmt: skip
        self.bytes = Counter(
            "conveyor_kv_tier_bytes_total",
            "Bytes the second KV tier moved, by direction (device_to_host, host_to_device, "
            "host_to_disk, disk_to_device)", ["model", "direction"], registry=reg,
        )  # fmt: skip
        self.blocks = Gauge(
            "conveyor_kv_tier_blocks", "KV blocks the second KV tier holds (host|disk)",
            ["model", "tier"], registry=reg,
        )  # fmt: skip

    def children(self, model: str) -> KVTierChildren:
        """``GeneratorMetrics``' tier fields for ``model``, every label made up front."""
        return KVTierChildren(
            kv_tier_hit_blocks={t: self.hit_blocks.labels(model, t) for t in KV_TIERS},
            kv_tier_bytes={d: self.bytes.labels(model, d) for d in KV_TIER_DIRECTIONS},
            kv_tier_blocks={t: self.blocks.labels(model, t) for t in KV_TIERS},
        )
