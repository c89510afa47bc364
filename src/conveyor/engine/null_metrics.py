"""A ``GeneratorMetrics`` that records nothing, for engines run outside a service.

Tests, benchmarks and library use build an engine without a metrics registry; the
engine then talks to these no-op children instead of checking for None at every count.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conveyor.observability.kv_tier_metrics import KV_TIER_DIRECTIONS, KV_TIERS
from conveyor.observability.metrics import FINISH_REASONS, OUTCOMES, STEP_PHASES, GeneratorMetrics
from conveyor.priority import Priority

__all__ = ["null_generator_metrics"]

# Children that come one per priority class.
BY_PRIORITY = ("latency_s", "time_to_first_token_s", "time_per_output_token_s")
# Children that come one per label value, of the families named.
BY_LABEL = ("requests", "finished", "step_phase_s", "kv_tier_hit_blocks", "kv_tier_bytes",
            "kv_tier_blocks")  # fmt: skip


class _NoOpMetric:
    """Takes the calls a Prometheus counter, gauge or histogram child takes; keeps nothing."""

    def inc(self, amount: float = 1.0) -> None:
        """Ignore an increment."""

    def set(self, *values: float) -> None:
        """Ignore a gauge's value (or the KV-cache gauges' three)."""

    def observe(self, value: float) -> None:
        """Ignore an observation."""


def null_generator_metrics() -> GeneratorMetrics:
    """Metrics whose every child (and every outcome of ``requests``) is a no-op."""
    noop = _NoOpMetric()
    children: dict[str, Any] = {
        field.name: noop
        for field in dataclasses.fields(GeneratorMetrics)
        if field.name not in (*BY_PRIORITY, *BY_LABEL, "adapters")
    }
    return GeneratorMetrics(
        **children,
        latency_s=dict.fromkeys(Priority, noop),
        time_to_first_token_s=dict.fromkeys(Priority, noop),
        time_per_output_token_s=dict.fromkeys(Priority, noop),
        requests=dict.fromkeys(OUTCOMES, noop),
        finished=dict.fromkeys(FINISH_REASONS, noop),
        step_phase_s=dict.fromkeys(STEP_PHASES, noop),
        kv_tier_hit_blocks=dict.fromkeys(KV_TIERS, noop),
        kv_tier_bytes=dict.fromkeys(KV_TIER_DIRECTIONS, noop),
        kv_tier_blocks=dict.fromkeys(KV_TIERS, noop),
    )
