"""The admission arithmetic of a simulated generative worker, as the generator's: 429 when
the waiting queue is at ``max_queue`` or the measured seat turnover (``SeatTurnover``) says
an online request would get a seat after its deadline; Retry-After as the engine's
estimated drain; how often waiting online requests are looked at for lateness.

Both worker models (``llm_worker`` on the real scheduler, ``counted_worker`` over counts)
hold one, each telling it its own queue's figures.
"""

from __future__ import annotations

import math

from conveyor.engine.core.seat_turnover import SeatTurnover
from conveyor.priority import Priority
from conveyor.sim.request import SimRequest

__all__ = ["RUN_TIME_SMOOTHING", "SHED_EVERY_S", "SeatGate"]

# As the engine: late waiting requests are looked for at most this often.
SHED_EVERY_S = 0.025
RUN_TIME_SMOOTHING = 0.1


class SeatGate:
    """Seat turnover, mean run time and the shedding clock of one worker."""

    def __init__(self, max_queue: int, max_num_seqs: int) -> None:
        """A gate for a queue of at most ``max_queue`` in front of ``max_num_seqs`` seats."""
        self.turnover = SeatTurnover()
        self._max_queue, self._seats = max_queue, max_num_seqs
        self._mean_run_s = 0.0
        self._next_shed_s = 0.0

    def refusal(
        self, request: SimRequest, now: float, num_waiting: int, num_waiting_online: int
    ) -> float | None:
        """The Retry-After of a 429 for an arriving request, or None to admit it (batch
        lines are never refused here)."""
        if request.priority is not Priority.ONLINE:
            return None
        if num_waiting + 1 > self._max_queue:
            return self.retry_after_s(num_waiting)
        wait_s = self.turnover.predicted_wait_s(num_waiting_online)
        if wait_s is not None and wait_s > request.deadline_s - now:
            return self.retry_after_s(num_waiting)
        return None

    def retry_after_s(self, num_waiting: int) -> float:
        """As the engine's ``estimated_drain_s``, at least a second."""
        interval_s = self.turnover.mean_interval_s
        if interval_s is not None:
            drain_s = num_waiting * interval_s
        else:
            drain_s = math.ceil(num_waiting / self._seats) * max(self._mean_run_s, 0.1)
        return float(max(1, round(drain_s)))

    def on_finish(self, now: float, admitted_s: float, num_waiting: int) -> None:
        """A request finished: a seat turned over; its run time joins the mean."""
        self.turnover.on_finish(now, num_waiting)
        self._mean_run_s += RUN_TIME_SMOOTHING * (now - admitted_s - self._mean_run_s)

    def is_shed_due(self, now: float) -> bool:
        """Whether waiting requests should be looked at for lateness now."""
        return now >= self._next_shed_s

    def shed_interval_s(self, now: float) -> float | None:
        """The seat interval to judge lateness by (the next look due ``SHED_EVERY_S`` on),
        or None while no seat has turned over yet."""
        interval_s = self.turnover.mean_interval_s
        if interval_s is None:
            return None
        self._next_shed_s = now + SHED_EVERY_S
        return interval_s
