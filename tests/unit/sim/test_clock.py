"""The virtual clock: time order, then schedule order; lanes change neither."""

from __future__ import annotations

import random

from conveyor.sim.clock import Clock


def test_events_run_in_time_then_schedule_order_and_cancelled_ones_not() -> None:
    clock, seen = Clock(), []
    clock.at(2.0, seen.append, "late")
    clock.at(1.0, seen.append, "first")
    clock.timer(1.0, seen.append, "second", lane="x")
    clock.timer(1.5, seen.append, "cancelled", lane="x").cancel()
    clock.timer(1.5, seen.append, "cancelled too").cancel()
    clock.run(10.0)
    assert seen == ["first", "second", "late"]
    assert clock.now == 10.0 and clock.num_events == 3


def schedule(clock: Clock, seen: list[int], rng: random.Random, lanes: bool) -> None:
    """Events that schedule more: plain ones, and timers a tenth of them cancelled, in lanes
    of a fixed delay each (in the lane's order) and at random times (out of it)."""
    for i in range(2000):
        now = clock.now
        if rng.random() < 0.4:
            clock.at(now + rng.choice([0.0, 0.5, rng.random()]), seen.append, i)
            continue
        lane = rng.choice(["a", "b"])
        delay = {"a": 1.0, "b": 3.0}[lane] if rng.random() < 0.9 else rng.random() * 4
        timer = clock.timer(now + delay, seen.append, i, lane=lane if lanes else None)
        if rng.random() < 0.1:
            timer.cancel()
        if rng.random() < 0.3:
            clock.at(now + rng.random(), schedule_one, clock, seen, rng, lanes, i)


def schedule_one(clock: Clock, seen: list[int], rng: random.Random, lanes: bool, i: int) -> None:
    seen.append(-i)
    clock.timer(clock.now + 1.0, seen.append, 10_000 + i, lane="a" if lanes else None)


def run(lanes: bool, seed: int) -> tuple[list[int], float, int]:
    clock, seen, rng = Clock(), [], random.Random(seed)
    clock.at(0.0, schedule, clock, seen, rng, lanes)
    clock.at(0.25, schedule, clock, seen, rng, lanes)
    clock.run(2.0)
    assert clock.num_pending > 0
    clock.run(100.0)
    assert clock.num_pending == 0
    return seen, clock.now, clock.num_events


def test_timers_in_lanes_run_when_and_in_the_order_the_heap_alone_runs_them() -> None:
    for seed in range(5):
        assert run(lanes=True, seed=seed) == run(lanes=False, seed=seed)
