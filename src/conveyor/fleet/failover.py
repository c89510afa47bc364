"""Failover admission: when a region's workers all disappear, admit what moves over gradually.

The clients of a lost region come to the gateways of the others at once; their workers'
queues would take the whole surge in a second. A gateway that sees a region go (it had
routable workers at one refresh and none at a later one) admits each model's requests
through a token bucket for ``ramp_s``: at first its own arrival rate from just before the
loss plus ``start_share`` of the expected surge, widening linearly to the whole surge
(its rate times lost regions over surviving ones, the traffic each survivor inherits when
load was even), after which the bucket is gone. Requests beyond it get 429 with
``Retry-After``: a client that waits comes in as the ramp widens.

Pure: callers pass the time and the arrival rates.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

__all__ = ["FailoverRamp", "FailoverSettings"]


@dataclass(frozen=True, slots=True)
class FailoverSettings:
    """How long the ramp lasts and where it starts."""

    ramp_s: float = 30.0  # 0: no ramp, the surge is admitted at once
    start_share: float = 0.1  # of the expected surge, admitted from the start
    min_rate_per_s: float = 1.0  # a model with no measured arrivals still admits this many
    burst_s: float = 1.0  # the bucket holds this many seconds of its rate

    def __post_init__(self) -> None:
        """Validate the knobs."""
        if self.ramp_s < 0 or not 0 <= self.start_share <= 1:
            raise ValueError("ramp_s must be >= 0 and start_share in [0, 1]")
        if self.min_rate_per_s <= 0 or self.burst_s <= 0:
            raise ValueError("min_rate_per_s and burst_s must be > 0")


@dataclass(slots=True)
class _Bucket:
    """One model's bucket during a ramp."""

    tokens: float
    refilled_at: float


@dataclass(slots=True)
class FailoverRamp:
    """Watches which regions have workers; runs the admission ramp after a loss."""

    settings: FailoverSettings = field(default_factory=FailoverSettings)
    started_at: float | None = None
    surge: float = 0.0  # expected traffic over the baseline, as a multiple of it
    lost: frozenset[str] = frozenset()
    _up: set[str] = field(default_factory=set)
    _baselines: dict[str, float] = field(default_factory=dict)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def observe(self, regions_up: Collection[str], rates: Mapping[str, float], now: float) -> None:
        """A registry refresh: ``regions_up`` have routable workers; ``rates`` are this
        gateway's arrivals per model right now. A region seen up before and missing now
        starts a ramp (``rates`` are its baselines)."""
        up = set(regions_up)
        gone = self._up - up
        self._up = up
        if gone and up and self.settings.ramp_s > 0:  # with no survivor there is none to ramp
            self.started_at = now
            self.lost = frozenset(gone)
            self.surge = len(gone) / len(up)
            self._baselines = dict(rates)
            self._buckets.clear()
        if self.started_at is not None and now - self.started_at >= self.settings.ramp_s:
            self.started_at = None  # the ramp is over: admit everything

    def is_ramping(self, now: float) -> bool:
        """Whether admission is limited right now."""
        return self.started_at is not None and now - self.started_at < self.settings.ramp_s

    def rate_per_s(self, model: str, now: float) -> float | None:
        """The bucket's rate for ``model`` now (None: not ramping)."""
        if self.started_at is None or not self.is_ramping(now):
            return None
        base = max(self._baselines.get(model, 0.0), self.settings.min_rate_per_s)
        share = self.settings.start_share
        widened = share + (1 - share) * (now - self.started_at) / self.settings.ramp_s
        return base * (1 + self.surge * widened)

    def admit(self, model: str, now: float) -> float | None:
        """None to admit one request of ``model``; else the seconds to wait (429)."""
        rate = self.rate_per_s(model, now)
        if rate is None:
            return None
        bucket = self._buckets.get(model)
        capacity = rate * self.settings.burst_s
        if bucket is None:
            bucket = self._buckets[model] = _Bucket(capacity, now)
        bucket.tokens = min(capacity, bucket.tokens + rate * (now - bucket.refilled_at))
        bucket.refilled_at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        return max(1.0, math.ceil((1 - bucket.tokens) / rate))
