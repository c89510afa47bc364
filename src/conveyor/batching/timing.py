"""How long a batch takes: a forgetting linear fit t(n) = a + b * n.

Used to predict an arriving input's wait (refuse it at once if it cannot meet
its deadline), to compute ``Retry-After`` and to export a service rate.

Once warm, one observation counts for at most ``max_outlier_ratio`` times the time
predicted for its size: a batch stalled by something else (a stop-the-world pause, a
busy machine) then moves the fit a little instead of teaching it that every batch is
slow. A real change in speed still shows: each batch moves the fit further.

The model also keeps how far recent batches fell from the fit (`spread_s`, the root mean
square of their errors): batches of one size differ by what is in them (longer texts) and
by what else the machine runs, and a caller sizing batches for a latency bound leaves
room for that.

For admission it also keeps the most that any of the last ``EXCESS_WINDOW`` batches held
the model past the fit, as the event loop saw them (`excess_s`): a batch's end reaches
the loop, and the next batch starts, only when the loop gets to it, and under a flood of
requests that adds milliseconds a batch that the model's own time does not show. A
recent maximum, not an average: an average learnt while idle lags a flood's first
seconds, and every batch ahead that runs longer than predicted moves an admitted input
towards a 504, while counting a batch a little long only refuses a few more inputs.
"""

from __future__ import annotations

import math
from collections import deque

# Added to the outlier cap so a model whose batches take ~0 s can still learn it slowed down.
OUTLIER_SLACK_S = 0.01
# Below this weighted variance of batch sizes (relative to the mean size squared, so float
# rounding cannot pass for spread), every batch had the same size: no slope can be fitted.
MIN_SIZE_VARIANCE_RATIO = 1e-6
# Batches whose excess over the fit counts in ``excess_s``: enough to hold the slowest of
# the last seconds of a flood, few enough that one stall is forgotten within a few seconds.
EXCESS_WINDOW = 20


class BatchTimeModel:
    """Exponentially weighted least squares over (batch size, seconds) pairs."""

    def __init__(
        self, *, alpha: float = 0.1, min_observations: int = 3, max_outlier_ratio: float = 4.0
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if max_outlier_ratio < 1:
            raise ValueError("max_outlier_ratio must be >= 1")
        self.alpha = alpha
        self.max_outlier_ratio = max_outlier_ratio
        self.min_observations = min_observations
        self.num_observations = 0
        self._n = 0.0
        self._t = 0.0
        self._nn = 0.0
        self._nt = 0.0
        self._squared_error = 0.0
        self._excesses_s: deque[float] = deque(maxlen=EXCESS_WINDOW)

    @property
    def is_warm(self) -> bool:
        """True once enough batches were seen for predictions to mean something."""
        return self.num_observations >= self.min_observations

    def observe(self, batch_size: int, seconds: float) -> None:
        """Record one batch (an outlier is capped first, see the module docstring)."""
        if self.is_warm:
            predicted_s = self.seconds_for(batch_size)
            seconds = min(seconds, self.max_outlier_ratio * predicted_s + OUTLIER_SLACK_S)
            error_s = seconds - predicted_s
            self._squared_error += self.alpha * (error_s * error_s - self._squared_error)
        w = 1.0 if self.num_observations == 0 else self.alpha
        self._n += w * (batch_size - self._n)
        self._t += w * (seconds - self._t)
        self._nn += w * (batch_size * batch_size - self._nn)
        self._nt += w * (batch_size * seconds - self._nt)
        self.num_observations += 1

    def observe_cycle(self, batch_size: int, seconds: float) -> None:
        """Record how long a batch held the model as the event loop saw it: from being
        taken to its end being seen there (model time and hand-off together).

        The excess over the fit counts for at most what the outlier cap allows."""
        predicted_s = self.seconds_for(batch_size)
        cap_s = (self.max_outlier_ratio - 1) * predicted_s + OUTLIER_SLACK_S
        self._excesses_s.append(min(max(0.0, seconds - predicted_s), cap_s))

    @property
    def excess_s(self) -> float:
        """The most a recent batch held the model past the fit (0 before any was seen)."""
        return max(self._excesses_s, default=0.0)

    @property
    def spread_s(self) -> float:
        """How far recent batches fell from the fit: the root mean square of their errors
        (weighted as the fit is; 0 until warm)."""
        return math.sqrt(self._squared_error)

    @property
    def has_slope(self) -> bool:
        """True once batches of different sizes were seen, so the per-input cost is known."""
        variance = self._nn - self._n * self._n
        return self._n > 0 and variance > MIN_SIZE_VARIANCE_RATIO * max(1.0, self._n * self._n)

    def seconds_per_input(self) -> float:
        """The fitted cost of one more input in a batch (0 while ``has_slope`` is False)."""
        if not self.has_slope:
            return 0.0
        return max(0.0, (self._nt - self._n * self._t) / (self._nn - self._n * self._n))

    def seconds_for(self, batch_size: int) -> float:
        """Predicted model time for a batch of ``batch_size``."""
        if not self.has_slope:
            return max(self._t, 0.0)
        slope = self.seconds_per_input()
        intercept = max(0.0, self._t - slope * self._n)
        return intercept + slope * batch_size

    def predicted_wait_s(
        self, num_ahead: int, cap: int, *, running_size: int = 0, running_for_s: float = 0.0
    ) -> float:
        """Time until an input with ``num_ahead`` inputs queued before it has its result.

        It waits out the batch running now (``running_size`` inputs, started
        ``running_for_s`` ago; 0: none), then every full batch ahead of it and its own,
        each counted ``excess_s`` longer than the fit.
        """
        num_batches = math.ceil((num_ahead + 1) / max(1, cap))
        queued_s = num_batches * (self.seconds_for(cap) + self.excess_s)
        if running_size < 1:
            return queued_s
        running_s = self.seconds_for(running_size) + self.excess_s
        return queued_s + max(0.0, running_s - running_for_s)

    def drain_time_s(self, num_queued: int, cap: int) -> float:
        """Time to run the whole queue at full batches."""
        return math.ceil(num_queued / max(1, cap)) * self.seconds_for(cap)

    def service_rate(self, cap: int) -> float:
        """Inputs per second at full batches (0 when unknown)."""
        seconds = self.seconds_for(cap)
        return cap / seconds if seconds > 0 else 0.0
