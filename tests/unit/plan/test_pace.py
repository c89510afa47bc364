"""``--calibrate`` keeps to its budget and says what it is doing, on a virtual clock."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.plan.calibrate import calibrate_generative, calibrate_one_shot
from conveyor.plan.curves import LinearCurve
from conveyor.plan.pace import DEFAULT_BUDGET_S, Pace
from tests.unit.plan.fake_servers import FakeBatcher, FakeEngine
from tests.virtual_time import run_virtual

# A slow model: a lone 32-token completion takes 3.2 s, so the full calibration (60 lone
# requests, 12 pairs, batches of 1 to 8 three times each) would take about 5 minutes.
SLOW_STEP = LinearCurve(0.100, 0.005)


async def slow_calibration(budget_s: float, lines: list[str]) -> tuple[float, int, int]:
    """Calibrate the slow fake within ``budget_s``: seconds taken, lone requests, the
    largest batch probed."""
    engine = FakeEngine(SLOW_STEP, prefill_s=0.1, max_batch=8)
    loop = asyncio.get_running_loop()
    started = loop.time()
    measured = await calibrate_generative(engine, 16, 32, 8, Pace(budget_s, lines.append))
    solo = int(engine.sums["conveyor_time_to_first_token_seconds_count"])
    return loop.time() - started, solo, measured.max_batch


def test_the_default_budget_is_two_minutes() -> None:
    assert DEFAULT_BUDGET_S == 120


def test_a_slow_model_is_calibrated_within_the_budget_with_fewer_repeats() -> None:
    lines: list[str] = []
    took_s, _, max_batch = run_virtual(slow_calibration(DEFAULT_BUDGET_S, lines))
    assert took_s <= DEFAULT_BUDGET_S
    assert max_batch >= 2  # a line needs two sizes
    solo = [line for line in lines if line.startswith("calibrate 1/3 lone requests: ")]
    assert solo and "/60," not in solo[-1]  # fewer than the 60 of an unhurried calibration
    full_took_s, full_solo, full_batch = run_virtual(slow_calibration(3600, []))
    assert full_took_s > 240 and full_batch == 8 and full_solo > 60


def test_every_step_reports_progress_and_what_is_left() -> None:
    lines: list[str] = []
    run_virtual(slow_calibration(DEFAULT_BUDGET_S, lines))
    for step in ("1/3 lone requests", "2/3 overlapping pairs", "3/3 batches"):
        assert any(line.startswith(f"calibrate {step}: ") for line in lines), lines
    assert lines[0].startswith("calibrate 1/3 lone requests: 1/60, 3.")  # at once, not later
    assert all(line.endswith("s left)") for line in lines)
    left = [int(line.rsplit("about ", 1)[1].split(" s")[0]) for line in lines if "about" in line]
    assert left and left[-1] <= left[0]


def test_a_one_shot_model_stops_doubling_when_the_next_size_would_not_fit() -> None:
    async def calibrate(budget_s: float) -> int:
        batcher = FakeBatcher(LinearCurve(1.0, 0.2), max_batch=64, max_wait_s=0.005)
        return (await calibrate_one_shot(batcher, 8, 64, Pace(budget_s))).max_batch

    assert run_virtual(calibrate(3600)) == 64
    assert 2 <= run_virtual(calibrate(60)) < 64


def test_a_pace_spreads_repeats_over_its_share_of_the_time_left() -> None:
    now = [0.0]
    pace = Pace(100, clock=lambda: now[0])
    assert pace.repeats(0.3, 1.0, 5, 60) == 30
    assert pace.repeats(0.3, 100.0, 5, 60) == 5 and pace.repeats(0.3, 0.01, 5, 60) == 60
    now[0] = 90.0
    assert pace.left_s == pytest.approx(10.0)
    with pytest.raises(ValueError):
        Pace(0)
