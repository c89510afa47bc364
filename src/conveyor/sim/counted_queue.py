"""The waiting requests of a counted worker (``counted_worker``), oldest first, and their
deadlines kept beside them in one array of floats.

The worker looks for late waiting requests every ``SHED_EVERY_S`` over queues of up to
``max_queue``. Reading every waiting sequence's deadline in Python for each look cost a
fifth of a large run (a slice of 600 workers, queues of about a thousand); from the array
numpy finds the same ones (``late_indices``, the decisions of the engine's ``late_ones``)
at a few microseconds a look.
"""

from __future__ import annotations

import bisect
from array import array

import numpy as np
import numpy.typing as npt

from conveyor.sim.counted_pool import CountedSeq

# Late ones found with a pass of numpy each; past this many in one look (a queue turning
# late as a whole) the rest is gone through one by one, as ``late_ones`` does.
VECTOR_PASSES = 8

_ranks = np.arange(1, 1025, dtype=np.float64)


def _arrival(seq: CountedSeq) -> int:
    return seq.arrival


def _ranks_to(n: int) -> npt.NDArray[np.float64]:
    """1.0, 2.0, ... n (at least): the places in the queue, as floats."""
    global _ranks
    if len(_ranks) < n:
        _ranks = np.arange(1, 2 * n + 1, dtype=np.float64)
    return _ranks


def late_indices(
    deadlines_s: npt.NDArray[np.float64], now_s: float, interval_s: float
) -> list[int]:
    """As ``engine.core.seat_turnover.late_ones`` (waiting requests in queue order, their
    first-token deadlines; each one dropped moves those behind it up), with the same float
    arithmetic: ``now + place * interval > deadline``, ``place`` an integer's float."""
    n = len(deadlines_s)
    ranks = _ranks_to(n)
    late: list[int] = []
    start = 0  # the first index not yet decided
    for _ in range(VECTOR_PASSES):
        if start == n:
            return late
        dropped = len(late)  # everyone from ``start`` on moved up by this many
        over = now_s + ranks[start - dropped : n - dropped] * interval_s > deadlines_s[start:]
        first = int(over.argmax())
        if not over[first]:
            return late
        late.append(start + first)
        start += first + 1
    position = start - len(late)
    for index, deadline_s in enumerate(deadlines_s[start:].tolist(), start):
        if now_s + (position + 1) * interval_s > deadline_s:
            late.append(index)
        else:
            position += 1
    return late


class WaitingQueue(list[CountedSeq]):
    """Waiting sequences in arrival order (a list: its length, indexing and iteration as
    fast as one), with their deadlines in an array beside. Changed through ``add``,
    ``remove`` and ``pop_head`` only, which keep the two in step."""

    __slots__ = ("_deadlines",)

    def __init__(self) -> None:
        super().__init__()
        self._deadlines = array("d")

    def add(self, seq: CountedSeq) -> None:
        """Queue ``seq`` at its arrival (after any equal one)."""
        if not self or self[-1].arrival <= seq.arrival:
            self.append(seq)
            self._deadlines.append(seq.deadline_s)
            return
        index = bisect.bisect_right(self, seq.arrival, key=_arrival)
        self.insert(index, seq)
        self._deadlines.insert(index, seq.deadline_s)

    def remove(self, seq: CountedSeq) -> None:
        """Take ``seq`` out (ValueError when it is not queued)."""
        index = self.index(seq, bisect.bisect_left(self, seq.arrival, key=_arrival))
        del self[index]
        del self._deadlines[index]

    def pop_head(self) -> CountedSeq:
        """Take out and return the oldest."""
        del self._deadlines[0]
        return self.pop(0)

    def late(self, now_s: float, interval_s: float) -> list[CountedSeq]:
        """The waiting sequences that would get a seat only after their deadline, a seat
        coming free every ``interval_s`` (``late_indices``)."""
        if not self:
            return []
        found = late_indices(np.frombuffer(self._deadlines), now_s, interval_s)
        return [self[index] for index in found]
