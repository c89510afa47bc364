"""How fast a saturated engine frees a place for the next waiting request.

A generative request waits for a seat (KV blocks and a slot in the running batch) until
running requests finish, and how long they run is unknown in advance. What can be
measured is the turnover while requests wait: the time between finishes during a stretch
in which the queue never emptied. That is the engine's seat capacity for the workload it
is serving, not the arrival rate (a lightly loaded engine finishes requests as slowly as
they come, which says nothing about how fast it could). A request that would find
``num_ahead`` online requests waiting starts after about ``num_ahead + 1`` such
intervals; if that passes its deadline it is refused at admission (429), not admitted to
miss it (504).

Pure bookkeeping with times passed in; the engine thread feeds it, the event loop reads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

# Intervals kept: enough to average over a few rounds of a full batch finishing.
WINDOW = 64
# No prediction before this many intervals: one burst's first finishes say little. The
# latest this many are also averaged alone, so a slowdown (a flood of callers takes the
# CPU the engine had while it was measured) shows within a few finishes.
MIN_INTERVALS = 8


class SeatTurnover:
    """The mean time between finishes while requests were waiting for a seat."""

    def __init__(self, window: int = WINDOW, min_intervals: int = MIN_INTERVALS) -> None:
        if window < 1 or not 1 <= min_intervals <= window:
            raise ValueError("need window >= 1 and 1 <= min_intervals <= window")
        self._intervals_s: deque[float] = deque(maxlen=window)
        self._min_intervals = min_intervals
        self._last_finish_s: float | None = None
        self._mean_s: float | None = None

    def on_queue(self, num_waiting: int) -> None:
        """After a step: an empty queue ends the stretch (an idle gap is no interval)."""
        if num_waiting == 0:
            self._last_finish_s = None

    def on_finish(self, now_s: float, num_waiting: int) -> None:
        """A request finished at ``now_s`` with ``num_waiting`` still waiting for a seat."""
        if num_waiting == 0:
            self._last_finish_s = None
            return
        if self._last_finish_s is not None:
            self._intervals_s.append(max(0.0, now_s - self._last_finish_s))
            if len(self._intervals_s) >= self._min_intervals:
                self._mean_s = max(
                    self._mean(len(self._intervals_s)), self._mean(self._min_intervals)
                )
        self._last_finish_s = now_s

    def _mean(self, count: int) -> float:
        """The mean of the latest ``count`` intervals."""
        latest = list(self._intervals_s)[-count:]
        return sum(latest) / len(latest)

    @property
    def mean_interval_s(self) -> float | None:
        """Seconds between seats coming free when saturated (the window's mean, or the
        latest intervals' when they are slower); None until measured."""
        return self._mean_s

    def predicted_wait_s(self, num_ahead: int) -> float | None:
        """Seconds until a request behind ``num_ahead`` waiting ones gets a seat."""
        mean_s = self._mean_s
        return None if mean_s is None else (num_ahead + 1) * mean_s


def late_ones(deadlines_s: Sequence[float | None], now_s: float, interval_s: float) -> list[int]:
    """Which of the waiting requests (in queue order, their first-token deadlines) would get
    a seat only after their deadline; each one dropped moves those behind it up."""
    late: list[int] = []
    position = 0
    for index, deadline_s in enumerate(deadlines_s):
        if deadline_s is not None and now_s + (position + 1) * interval_s > deadline_s:
            late.append(index)
        else:
            position += 1
    return late
