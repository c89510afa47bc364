"""Measured or modelled cost curves: time against batch size, fitted as a straight line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LinearCurve:
    """``t(n) = fixed_s + per_item_s * n``: a batch's (or a decode step's) time at size n."""

    fixed_s: float
    per_item_s: float

    def at(self, n: float) -> float:
        """Seconds at size ``n``."""
        return self.fixed_s + self.per_item_s * n

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> LinearCurve:
        """Least squares through ``(n, seconds)`` points; slope and intercept kept >= 0."""
        if not points:
            raise ValueError("no measurements to fit")
        if len({n for n, _ in points}) < 2:
            mean_s = sum(t for _, t in points) / len(points)
            return cls(mean_s, 0.0)
        mean_n = sum(n for n, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        var_n = sum((n - mean_n) ** 2 for n, _ in points)
        slope = sum((n - mean_n) * (t - mean_t) for n, t in points) / var_n
        slope = max(0.0, slope)
        return cls(max(0.0, mean_t - slope * mean_n), slope)
