"""Read a Prometheus registry back into plain numbers, per model (no text round trip)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry

Buckets = list[tuple[float, float]]


class MetricReader:
    """One snapshot of a registry: scalar samples and histogram buckets by model."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.values: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
        # name -> model -> the other label's value ("" when none) -> buckets
        self.buckets: dict[str, dict[str, dict[str, Buckets]]] = defaultdict(dict)
        for family in registry.collect():
            for sample in family.samples:
                model = sample.labels.get("model")
                if model is None:
                    continue
                rest = ":".join(v for k, v in sample.labels.items() if k not in ("model", "le"))
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    by_label = self.buckets[sample.name].setdefault(model, {})
                    by_label.setdefault(rest, []).append((le, sample.value))
                else:
                    self.values[sample.name].setdefault(model, {})[rest] = sample.value

    def models(self) -> set[str]:
        """Every model some sample names."""
        return {m for by_model in self.values.values() for m in by_model}

    def value(self, name: str, model: str, label: str = "") -> float:
        """One sample (0 when absent)."""
        return self.values.get(name, {}).get(model, {}).get(label, 0.0)

    def by_label(self, name: str, model: str) -> dict[str, float]:
        """Every sample of ``name`` for ``model``, keyed by its other label's value."""
        return dict(self.values.get(name, {}).get(model, {}))

    def histogram(self, name: str, model: str, label: str = "") -> list[list[float | None]]:
        """Cumulative buckets as ``[upper bound, count]`` (``None`` for +Inf, JSON-safe), of
        the series whose other label is ``label`` (e.g. a priority class)."""
        rows = self.buckets.get(f"{name}_bucket", {}).get(model, {}).get(label, [])
        return [[None if math.isinf(le) else le, count] for le, count in rows]

    def has(self, name: str, model: str) -> bool:
        """True when ``name`` has a sample for ``model``."""
        return model in self.values.get(name, {})


def jsonable(value: Any) -> Any:
    """Floats that JSON can carry (NaN and infinities become None)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
