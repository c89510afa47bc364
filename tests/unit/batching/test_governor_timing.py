"""OOM cap memory and probe-up; the batch-time model's predictions."""

from __future__ import annotations

import pytest

from conveyor.batching.governor import BatchSizeGovernor
from conveyor.batching.timing import EXCESS_WINDOW, BatchTimeModel


def test_governor_halves_then_probes_back_up() -> None:
    gov = BatchSizeGovernor(64, probe_interval_s=10.0)
    assert gov.cap(now=0.0) == 64
    assert gov.on_oom(64, now=1.0) == 32
    assert gov.on_oom(32, now=2.0) == 16
    assert gov.cap(now=5.0) == 16  # remembered
    assert gov.cap(now=12.0) == 32  # probe one step up
    assert gov.cap(now=13.0) == 32
    assert gov.cap(now=22.0) == 64
    assert gov.cap(now=100.0) == 64
    assert not gov.is_backed_off


def test_governor_never_below_one() -> None:
    gov = BatchSizeGovernor(4)
    assert gov.on_oom(1, now=0.0) == 1


def test_governor_validates() -> None:
    with pytest.raises(ValueError):
        BatchSizeGovernor(0)


def test_timing_fits_fixed_plus_per_item() -> None:
    model = BatchTimeModel(alpha=0.2)
    for size in (1, 10, 50, 100, 5, 80) * 5:
        model.observe(size, 0.020 + 0.001 * size)
    assert model.seconds_for(100) == pytest.approx(0.120, rel=0.01)
    assert model.seconds_for(1) == pytest.approx(0.021, rel=0.05)
    assert model.service_rate(100) == pytest.approx(100 / 0.120, rel=0.01)


def test_timing_constant_batch_time() -> None:
    model = BatchTimeModel()
    for _ in range(5):
        model.observe(100, 0.020)
    assert model.is_warm
    assert model.seconds_for(100) == pytest.approx(0.020)
    assert model.seconds_per_input() == 0.0  # one size seen: no slope to fit
    # 250 ahead with batches of 100: the new input rides in the 3rd batch.
    assert model.predicted_wait_s(250, cap=100) == pytest.approx(0.060)
    assert model.drain_time_s(1000, cap=100) == pytest.approx(0.200)


def test_timing_cold_is_not_warm() -> None:
    model = BatchTimeModel(min_observations=3)
    model.observe(1, 0.01)
    assert not model.is_warm


def test_timing_one_outlier_batch_moves_the_fit_only_a_little() -> None:
    model = BatchTimeModel()
    for _ in range(10):
        model.observe(8, 0.02)
    model.observe(8, 35.0)  # a stalled batch
    # Capped at 4 x 20 ms + 10 ms before weighting (alpha 0.1): 20 + 0.1 x (90 - 20) ms.
    assert model.seconds_for(8) == pytest.approx(0.027)
    assert model.predicted_wait_s(0, 8) < 0.1


def test_timing_a_real_slowdown_is_still_learnt() -> None:
    model = BatchTimeModel()
    for _ in range(10):
        model.observe(8, 0.02)
    for _ in range(40):
        model.observe(8, 1.0)  # the model really became 50 x slower
    assert model.seconds_for(8) == pytest.approx(1.0, rel=0.05)


def test_timing_rejects_an_outlier_ratio_below_one() -> None:
    with pytest.raises(ValueError, match="max_outlier_ratio"):
        BatchTimeModel(max_outlier_ratio=0.5)


def test_governor_oom_above_the_cap_never_raises_it() -> None:
    """An OOM reported for a batch larger than the cap (an older, bigger batch) keeps the cap."""
    gov = BatchSizeGovernor(64, probe_interval_s=10.0)
    assert gov.on_oom(64, now=0.0) == 32
    assert gov.on_oom(128, now=1.0) == 32
    assert gov.cap(now=2.0) == 32


def test_governor_probe_stops_at_a_maximum_that_is_not_a_power_of_two() -> None:
    """Probing doubles the cap but never past ``max_batch_size``."""
    gov = BatchSizeGovernor(48, probe_interval_s=10.0)
    assert gov.on_oom(40, now=0.0) == 20
    assert gov.cap(now=10.0) == 40
    assert gov.cap(now=20.0) == 48  # not 80
    assert gov.cap(now=30.0) == 48
    assert not gov.is_backed_off


def _linear_model() -> BatchTimeModel:
    """A warm model fitted to batches taking 20 ms plus 1 ms per input."""
    model = BatchTimeModel(alpha=0.2)
    for size in (1, 10, 50, 100, 5, 80) * 5:
        model.observe(size, 0.020 + 0.001 * size)
    return model


@pytest.mark.parametrize(
    ("num_ahead", "cap", "num_batches"),
    [
        *[(0, 100, 1), (1, 100, 1), (99, 100, 1), (100, 100, 2), (199, 100, 2), (200, 100, 3)],
        *[(0, 1, 1), (2, 1, 3)],
    ],
)
def test_predicted_wait_counts_the_batch_the_new_input_rides_in(
    num_ahead: int, cap: int, num_batches: int
) -> None:
    """An input waits for every full batch ahead of it and then for its own batch."""
    model = _linear_model()
    expected_s = num_batches * (0.020 + 0.001 * cap)
    assert model.predicted_wait_s(num_ahead, cap=cap) == pytest.approx(expected_s, rel=0.01)


@pytest.mark.parametrize(
    ("running_size", "running_for_s", "left_s"),
    [(0, 0.0, 0.0), (1, 0.0, 0.021), (10, 0.0, 0.030), (10, 0.010, 0.020), (10, 0.5, 0.0)],
)
def test_predicted_wait_adds_what_is_left_of_the_running_batch(
    running_size: int, running_for_s: float, left_s: float
) -> None:
    """Before the queue ahead, the input waits out the batch running now (never less than 0)."""
    model = _linear_model()
    queued_s = 2 * (0.020 + 0.001 * 100)  # 150 ahead in batches of 100: the 2nd batch
    wait_s = model.predicted_wait_s(
        150, cap=100, running_size=running_size, running_for_s=running_for_s
    )
    assert wait_s == pytest.approx(queued_s + left_s, rel=0.01)


def test_a_running_batch_of_unknown_age_counts_whole() -> None:
    """Without ``running_for_s`` the running batch is taken as just started."""
    model = _linear_model()
    queued_s = 2 * (0.020 + 0.001 * 100)
    wait_s = model.predicted_wait_s(150, cap=100, running_size=10)
    assert wait_s == pytest.approx(queued_s + 0.030, rel=0.01)


def test_each_batch_counts_the_most_a_recent_one_ran_past_the_fit() -> None:
    """Batches the loop saw end 1, 5 and 2 ms past the fit: each one waited for counts 5."""
    model = _linear_model()
    for excess_s in (0.001, 0.005, 0.002):
        model.observe_cycle(100, 0.020 + 0.001 * 100 + excess_s)
    assert model.excess_s == pytest.approx(0.005)
    per_batch_s = 0.020 + 0.001 * 100 + 0.005
    assert model.predicted_wait_s(150, cap=100) == pytest.approx(2 * per_batch_s, rel=0.01)
    wait_s = model.predicted_wait_s(150, cap=100, running_size=100, running_for_s=0.0)
    assert wait_s == pytest.approx(3 * per_batch_s, rel=0.01)


def test_a_slow_batch_is_forgotten_after_the_window() -> None:
    """The excess is the most of the last EXCESS_WINDOW batches, never one faster than the fit."""
    model = _linear_model()
    model.observe_cycle(10, 0.030 + 0.008)
    for _ in range(EXCESS_WINDOW - 1):
        model.observe_cycle(10, 0.030 + 0.001)
    assert model.excess_s == pytest.approx(0.008)
    model.observe_cycle(10, 0.020)  # faster than the fit: no excess, and the 8 ms leaves
    assert model.excess_s == pytest.approx(0.001)


def test_one_stalled_batch_counts_no_more_than_an_outlier() -> None:
    """A loop frozen for 35 s behind a 30 ms batch: it counts as 4 x 30 ms + 10 ms at most."""
    model = _linear_model()
    model.observe_cycle(10, 35.0)
    assert model.excess_s == pytest.approx(3 * 0.030 + 0.010, rel=0.01)


def test_an_unobserved_model_has_no_excess() -> None:
    """Before any batch was seen on the loop, batches count as the fit says."""
    assert BatchTimeModel().excess_s == 0.0


@pytest.mark.parametrize(
    ("num_queued", "cap", "num_batches"),
    [
        (0, 100, 0),
        (1, 100, 1),
        (100, 100, 1),
        (101, 100, 2),
        (150, 100, 2),
        (201, 100, 3),
        (3, 1, 3),
    ],
)
def test_drain_time_counts_a_partial_last_batch(
    num_queued: int, cap: int, num_batches: int
) -> None:
    """Draining the queue takes one batch per ``cap`` inputs, a partial batch included."""
    model = _linear_model()
    expected_s = num_batches * (0.020 + 0.001 * cap)
    assert model.drain_time_s(num_queued, cap=cap) == pytest.approx(expected_s, rel=0.01)


def test_an_unobserved_model_knows_nothing() -> None:
    """Before the first batch every prediction is zero and the service rate unknown (0)."""
    model = BatchTimeModel()
    assert model.seconds_for(100) == 0.0
    assert model.seconds_per_input() == 0.0
    assert model.service_rate(100) == 0.0
    assert model.predicted_wait_s(10, cap=4) == 0.0


def test_per_item_cost_is_learned_from_small_batches_too() -> None:
    """Batches of one and two inputs are enough to see what each input costs."""
    model = BatchTimeModel(alpha=0.5)
    for size in (1, 2) * 10:
        model.observe(size, 0.010 + 0.010 * size)
    assert model.seconds_for(1) == pytest.approx(0.020, rel=0.01)
    assert model.seconds_for(2) == pytest.approx(0.030, rel=0.01)


def test_noisy_data_never_predicts_bigger_batches_as_faster() -> None:
    """A fit whose slope comes out negative (noise) is clamped: time never falls with size."""
    model = BatchTimeModel(alpha=0.5)
    for size, seconds in [(10, 0.30), (100, 0.10), (10, 0.30), (100, 0.10)]:
        model.observe(size, seconds)
    small, large = model.seconds_for(10), model.seconds_for(1000)
    assert large > 0
    assert large >= small
    assert model.service_rate(1000) > 0


def test_first_observation_is_the_whole_estimate_then_later_ones_blend_in() -> None:
    """The first batch counts in full; each later one moves the estimate by ``alpha``."""
    model = BatchTimeModel(alpha=0.5)
    model.observe(10, 0.1)
    assert model.seconds_for(10) == pytest.approx(0.1)
    assert model.seconds_for(20) == pytest.approx(0.1)  # one size seen: no per-item cost yet
    model.observe(10, 0.2)
    assert model.seconds_for(10) == pytest.approx(0.15)


def test_timing_is_warm_exactly_at_min_observations() -> None:
    """Predictions are trusted from the ``min_observations``-th batch on, not one later."""
    model = BatchTimeModel(min_observations=3)
    for _ in range(2):
        model.observe(4, 0.01)
    assert not model.is_warm
    model.observe(4, 0.01)
    assert model.is_warm


def test_timing_validates_alpha() -> None:
    """alpha outside (0, 1] is refused; 1 (no memory) is allowed."""
    for alpha in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            BatchTimeModel(alpha=alpha)
    BatchTimeModel(alpha=1.0)


def test_a_model_whose_batches_took_no_time_still_learns_it_slowed_down() -> None:
    model = BatchTimeModel()
    for _ in range(5):
        model.observe(4, 0.0)
    for _ in range(60):
        model.observe(4, 1.0)  # each capped at 4 x the prediction + 10 ms: the fit still grows
    assert model.seconds_for(4) == pytest.approx(1.0, rel=0.05)


def test_timing_is_warm_after_three_batches_by_default() -> None:
    model = BatchTimeModel()
    model.observe(1, 0.01)
    model.observe(1, 0.01)
    assert not model.is_warm
    model.observe(1, 0.01)
    assert model.is_warm


def test_timing_an_outlier_ratio_of_one_caps_at_the_prediction_plus_slack() -> None:
    model = BatchTimeModel(alpha=1.0, max_outlier_ratio=1.0)
    for _ in range(3):
        model.observe(8, 0.02)
    model.observe(8, 5.0)
    assert model.seconds_for(8) == pytest.approx(0.03)


def test_governor_probes_thirty_seconds_after_an_oom_by_default() -> None:
    gov = BatchSizeGovernor(8)
    assert gov.on_oom(8, now=100.0) == 4
    assert gov.cap(now=129.9) == 4
    assert gov.cap(now=130.0) == 8


def test_governor_probe_interval_must_be_positive_and_may_be_under_a_second() -> None:
    with pytest.raises(ValueError, match="probe_interval_s"):
        BatchSizeGovernor(8, probe_interval_s=0)
    gov = BatchSizeGovernor(8, probe_interval_s=0.5)
    assert gov.on_oom(8, now=0.0) == 4
    assert gov.cap(now=0.5) == 8
