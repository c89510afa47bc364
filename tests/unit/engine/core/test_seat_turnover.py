"""Seat turnover: the time between finishes while requests wait, and the wait it predicts."""

from __future__ import annotations

import pytest

from conveyor.engine.core.seat_turnover import SeatTurnover, late_ones


def saturated(turnover: SeatTurnover, start_s: float, interval_s: float, count: int) -> float:
    """`count` finishes `interval_s` apart with requests waiting; the last finish time."""
    now_s = start_s
    for _ in range(count):
        turnover.on_finish(now_s, num_waiting=5)
        now_s += interval_s
    return now_s - interval_s


def test_no_prediction_until_enough_saturated_intervals() -> None:
    turnover = SeatTurnover(window=16, min_intervals=4)
    saturated(turnover, 0.0, 0.5, 4)  # 3 intervals
    assert turnover.predicted_wait_s(10) is None
    turnover.on_finish(2.0, num_waiting=5)  # the 4th interval
    assert turnover.mean_interval_s == pytest.approx(0.5)
    assert turnover.predicted_wait_s(9) == pytest.approx(5.0)  # 10 seats to come free


def test_finishes_with_nobody_waiting_say_nothing_of_capacity() -> None:
    turnover = SeatTurnover(window=16, min_intervals=2)
    for second in range(10):  # a lightly loaded engine: one finish a second, queue empty
        turnover.on_finish(float(second), num_waiting=0)
    assert turnover.mean_interval_s is None


def test_an_idle_gap_between_bursts_is_not_an_interval() -> None:
    turnover = SeatTurnover(window=16, min_intervals=2)
    last_s = saturated(turnover, 0.0, 0.1, 3)
    turnover.on_queue(num_waiting=0)  # the queue emptied; an hour passes
    saturated(turnover, last_s + 3600.0, 0.1, 3)
    assert turnover.mean_interval_s == pytest.approx(0.1)


def test_the_mean_follows_the_latest_window() -> None:
    turnover = SeatTurnover(window=4, min_intervals=2)
    last_s = saturated(turnover, 0.0, 1.0, 5)
    saturated(turnover, last_s + 0.2, 0.2, 5)  # faster now: the window holds only these
    assert turnover.mean_interval_s == pytest.approx(0.2)


def test_finishes_in_one_step_count_as_zero_intervals() -> None:
    turnover = SeatTurnover(window=8, min_intervals=4)
    for now_s in (0.0, 0.0, 0.0, 0.0, 1.0):  # four finish in one step, one a second later
        turnover.on_finish(now_s, num_waiting=3)
    assert turnover.mean_interval_s == pytest.approx(0.25)


@pytest.mark.parametrize(("window", "min_intervals"), [(0, 1), (4, 0), (4, 5)])
def test_bad_sizes_are_refused(window: int, min_intervals: int) -> None:
    with pytest.raises(ValueError):
        SeatTurnover(window=window, min_intervals=min_intervals)


def test_a_slowdown_shows_in_the_latest_intervals_at_once() -> None:
    turnover = SeatTurnover(window=64, min_intervals=4)
    last_s = saturated(turnover, 0.0, 0.1, 60)
    saturated(turnover, last_s + 0.4, 0.4, 4)  # four slow finishes after sixty fast ones
    assert turnover.mean_interval_s == pytest.approx(0.4)


def test_late_ones_are_those_whose_seat_comes_after_their_deadline() -> None:
    # One seat a second from now (t = 10): positions 0, 1, 2 get seats at 11, 12, 13.
    deadlines = [11.5, 11.5, None, 20.0, 14.0]  # the last gets its seat at 14: in time
    # The second (due 11.5, seat at 12) is late; the ones behind it move up a place.
    assert late_ones(deadlines, now_s=10.0, interval_s=1.0) == [1]
    assert late_ones([10.5, 10.5], now_s=10.0, interval_s=1.0) == [0, 1]
    assert late_ones([], now_s=10.0, interval_s=1.0) == []
