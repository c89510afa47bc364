"""A ``GeneratorMetrics`` that records nothing, for engines run outside a service.

Tests, benchmarks and library use build an engine without a metrics registry; the
engine then talks to these no-op children instead of checking for None at every count.
"""

from __future__ import annotations

import dataclasses

from conveyor.observability.metrics import FINISH_REASONS, OUTCOMES, STEP_PHASES, GeneratorMetrics

__all__ = ["null_generator_metrics"]


class _NoOpMetric:
    """Takes the calls a Prometheus counter, gauge or histogram child takes; keeps nothing."""

    def inc(self, amount: float = 1.0) -> None:
        """Ignore an increment."""

    def set(self, value: float) -> None:
        """Ignore a gauge value."""

    def observe(self, value: float) -> None:
        """Ignore an observation."""


def null_generator_metrics() -> GeneratorMetrics:
    """Metrics whose every child (and every outcome of ``requests``) is a no-op."""
    noop = _NoOpMetric()
    children = {
        field.name: noop
        for field in dataclasses.fields(GeneratorMetrics)
        if field.name not in ("requests", "finished", "step_phase_s")
    }
    return GeneratorMetrics(
        **children,
        requests=dict.fromkeys(OUTCOMES, noop),
        finished=dict.fromkeys(FINISH_REASONS, noop),
        step_phase_s=dict.fromkeys(STEP_PHASES, noop),
    )
