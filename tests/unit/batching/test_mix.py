"""The batch size limit while online traffic and a batch job share a model."""

from __future__ import annotations

import pytest

from conveyor.batching.mix import mixed_batch_limit
from conveyor.batching.timing import BatchTimeModel


def fitted(
    fixed_s: float, per_input_s: float, sizes: tuple[int, ...] = (1, 50, 100)
) -> BatchTimeModel:
    model = BatchTimeModel()
    for _ in range(4):
        for size in sizes:
            model.observe(size, fixed_s + per_input_s * size)
    return model


def test_two_waits_fit_one_small_batch_plus_one_full_batch_plus_the_slack() -> None:
    # 20 ms + 0.3 ms an input: t(1) = 20.3, t(100) = 50; budget (20.3 + 50 + 10) / 2 = 40.15
    # ms, which 67 inputs fit (40.1 ms) and 68 do not (40.4 ms).
    timing = fitted(0.02, 0.0003)
    limit = mixed_batch_limit(100, timing, slack_s=0.010)
    assert limit == 67
    assert 2 * timing.seconds_for(limit) <= timing.seconds_for(1) + timing.seconds_for(100) + 0.01


def test_a_larger_slack_allows_larger_batches_up_to_the_cap() -> None:
    timing = fitted(0.02, 0.0003)
    assert mixed_batch_limit(100, timing, slack_s=0.0) == 50
    assert mixed_batch_limit(100, timing, slack_s=1.0) == 100


def test_with_one_batch_size_seen_the_cost_is_taken_as_proportional() -> None:
    timing = fitted(0.02, 0.0003, sizes=(100,))
    assert not timing.has_slope
    # t(100) = 50 ms taken as 0.5 ms an input: budget (0.5 + 50 + 0) / 2 = 25.25 ms.
    assert mixed_batch_limit(100, timing, slack_s=0.0) == 50


def test_a_cold_model_or_a_cap_of_one_is_left_alone() -> None:
    assert mixed_batch_limit(100, BatchTimeModel(), slack_s=0.01) == 100
    warming = BatchTimeModel(min_observations=3)
    for _ in range(2):  # some cost seen, but not yet enough to go by
        warming.observe(100, 0.05)
    assert mixed_batch_limit(100, warming, slack_s=0.0) == 100
    assert mixed_batch_limit(1, fitted(0.02, 0.0003), slack_s=0.0) == 1


def test_free_extra_inputs_fill_the_batch() -> None:
    assert mixed_batch_limit(100, fitted(0.02, 0.0), slack_s=0.0) == 100


def test_a_huge_fixed_cost_still_allows_one_input() -> None:
    assert mixed_batch_limit(100, fitted(10.0, 0.0003), slack_s=0.0) >= 1


def test_a_batch_of_two_is_split_when_one_input_already_fills_the_budget() -> None:
    # 10 ms + 10 ms an input: t(1) = 20, t(2) = 30; budget (20 + 30) / 2 = 25 ms fits one.
    pair = fitted(0.01, 0.01, sizes=(1, 2))
    assert mixed_batch_limit(2, pair, slack_s=0.0) == 1


def test_batches_that_stray_from_the_fit_leave_room_for_their_spread() -> None:
    # As the first test, but every batch runs 4 ms over or under the line: each of the two
    # waits leaves two spreads' room (a spread is about 4 ms; the forgetting fit wobbles a
    # little too), so the budget is about 40.15 - 8 = 32 ms: about 40 inputs, not 67.
    timing = BatchTimeModel()
    for i in range(400):
        size = (1, 50, 100)[i % 3]
        timing.observe(size, 0.02 + 0.0003 * size + (0.004 if i % 2 else -0.004))
    assert timing.spread_s == pytest.approx(0.004, rel=0.15)
    exact = fitted(0.02, 0.0003)
    assert exact.spread_s == pytest.approx(0.0, abs=1e-9)
    assert mixed_batch_limit(100, exact, slack_s=0.010) == 67
    assert 36 <= mixed_batch_limit(100, timing, slack_s=0.010) <= 42
