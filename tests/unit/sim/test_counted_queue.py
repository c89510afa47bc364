"""The counted worker's waiting queue: its order, its deadlines array, and late ones found
as the engine's ``late_ones`` finds them."""

from __future__ import annotations

import random

import numpy as np
import pytest

from conveyor.engine.core.seat_turnover import late_ones
from conveyor.sim.counted_pool import CountedSeq
from conveyor.sim.counted_queue import VECTOR_PASSES, WaitingQueue, late_indices
from conveyor.sim.request import SimRequest


def seq(arrival: int, deadline_s: float) -> CountedSeq:
    request = SimRequest(arrival, "s", "t", [], 10, 0.0, deadline_s, prompt_len=10)
    return CountedSeq(request, lambda *_: None, arrival, 0.0, 10, 10, 10, deadline_s)


def same_as_late_ones(deadlines: list[float], now_s: float, interval_s: float) -> None:
    found = late_indices(np.array(deadlines, dtype=np.float64), now_s, interval_s)
    assert found == late_ones(deadlines, now_s, interval_s)


@pytest.mark.parametrize("seed", range(40))
def test_late_indices_decide_as_late_ones(seed: int) -> None:
    """Queues in arrival order (deadlines mostly rising), shuffled ones, and turnovers from
    none late to all late (more than the numpy passes, so the one-by-one tail runs too)."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 5, 40, 700, 1500, 3000])
    now = rng.uniform(0, 100)
    deadlines = sorted(now + rng.uniform(-1, 30) for _ in range(n))
    if seed % 3 == 0:
        rng.shuffle(deadlines)
    for interval in (1e-4, 0.01, 0.03, 0.05, 0.2, 5.0):
        same_as_late_ones(deadlines, now, interval)


def test_a_deadline_met_exactly_is_not_late() -> None:
    """``now + place * interval > deadline`` in the same float arithmetic: equal is in time."""
    now, interval = 10.0, 0.1
    deadlines = [now + (place + 1) * interval for place in range(50)]
    assert late_indices(np.array(deadlines), now, interval) == []
    nudged = [d - 1e-12 for d in deadlines]
    assert late_indices(np.array(nudged), now, interval) == late_ones(nudged, now, interval)
    assert late_ones(nudged, now, interval) == [0]  # the others move up a place: in time


def test_more_late_than_the_numpy_passes_finish_one_by_one() -> None:
    """Every other request late, past ``VECTOR_PASSES`` of them."""
    now, interval = 0.0, 1.0
    deadlines = [0.5 if i % 2 else 100.0 for i in range(4 * VECTOR_PASSES)]
    found = late_indices(np.array(deadlines), now, interval)
    assert found == late_ones(deadlines, now, interval)
    assert len(found) == 2 * VECTOR_PASSES


def test_the_queue_keeps_arrival_order_and_each_deadline_beside_its_request() -> None:
    queue = WaitingQueue()
    assert not queue and queue.late(0.0, 1.0) == []
    for arrival in (3, 1, 4, 2, 6, 5):
        queue.add(seq(arrival, float(arrival)))
    assert [s.arrival for s in queue] == [1, 2, 3, 4, 5, 6]
    queue.remove(queue[2])
    assert queue.pop_head().arrival == 1
    assert [s.arrival for s in queue] == [2, 4, 5, 6] and len(queue) == 4
    # Deadlines 2, 4, 5, 6 at places 1-4, a seat every 2.1 s from 0: 2 is late, then 4 and
    # 5 in time at places 1 and 2, then 6 late at place 3.
    assert [s.arrival for s in queue.late(0.0, 2.1)] == [2, 6]
    assert late_ones([2.0, 4.0, 5.0, 6.0], 0.0, 2.1) == [0, 3]
    with pytest.raises(ValueError):
        queue.remove(seq(9, 9.0))
