"""Token bucket arithmetic on a fake clock: refill, all-or-nothing takes, waits, settling."""

from __future__ import annotations

import pytest

from conveyor.tenants.buckets import BucketState, level_at, settle, take


def test_a_new_bucket_is_full_and_refills_a_minute_s_worth_in_a_minute() -> None:
    assert level_at(None, 600, now_s=0) == 600
    state = BucketState(level=0, updated_at_s=100)
    assert level_at(state, 600, now_s=110) == pytest.approx(100)  # 10 a second
    assert level_at(state, 600, now_s=1000) == 600  # never above capacity


def test_a_take_is_all_or_nothing_and_names_the_longest_wait() -> None:
    states: dict[str, BucketState] = {}
    ok = take(states, [("requests", 60, 1), ("input_tokens", 600, 500)], now_s=0)
    assert ok.is_admitted and [v.remaining for v in ok.views] == [59, 100]
    refused = take(states, [("requests", 60, 1), ("input_tokens", 600, 400)], now_s=0)
    assert not refused.is_admitted and refused.refused_by == "input_tokens"
    assert refused.retry_after_s == pytest.approx(30)  # 300 short at 10 tokens a second
    assert states["requests"].level == 59  # the refused take left every bucket alone
    assert take(states, [("requests", 60, 1), ("input_tokens", 600, 400)], now_s=30).is_admitted


def test_views_report_remaining_and_time_until_full() -> None:
    decision = take({}, [("requests", 60, 6)], now_s=5)
    (view,) = decision.views
    assert (view.capacity, view.remaining) == (60, 54)
    assert view.reset_s == pytest.approx(6)


def test_settling_refunds_up_to_capacity_and_may_leave_a_debt() -> None:
    states: dict[str, BucketState] = {}
    take(states, [("output_tokens", 100, 80)], now_s=0)
    settle(states, "output_tokens", 100, 50, now_s=0)  # 50 of the 80 unused
    assert states["output_tokens"].level == 70
    settle(states, "output_tokens", 100, 1000, now_s=0)
    assert states["output_tokens"].level == 100
    settle(states, "output_tokens", 100, -150, now_s=0)  # used more than reserved
    assert states["output_tokens"].level == -50
    refused = take(states, [("output_tokens", 100, 0)], now_s=0)
    assert not refused.is_admitted and refused.retry_after_s == pytest.approx(30)
