"""OOM cap memory and probe-up; the batch-time model's predictions."""

from __future__ import annotations

import pytest

from conveyor.batching.governor import BatchSizeGovernor
from conveyor.batching.timing import BatchTimeModel


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
    # Capped at 4 x 20 ms + 10 ms before weighting: the fit stays well under 100 ms.
    assert model.seconds_for(8) < 0.03
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
