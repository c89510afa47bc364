"""`conveyor plan --calibrate` checked against measurement on this machine.

The synthetic model's plan is checked here: calibrate a running model, run the load the
plan predicts for, and the measured throughput and p99 land within 20 % of the plan. The
tiny Llama's plan is measured the same way by `bench.plan_accuracy` (its smoke run is in
the integration tests): on a host whose speed wanders within a run its calibration moves
with it, so its accuracy is a benchmark figure, not a pass/fail test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bench.plan_accuracy import SYN, Options, synthetic_round

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

ATTEMPTS = 3


def test_a_synthetic_model_meets_its_calibrated_plan(
    server_factory: Callable[[dict[str, Any]], Server], tmp_path: Path
) -> None:
    """Pass when one of ATTEMPTS calibrate-then-load rounds lands within 20 %: this
    machine's cores are shared, so a stall elsewhere can spoil one round's p99; a plan that
    is wrong fails every round."""
    server = server_factory({"models": [SYN]})
    opts = Options(tmp_path, is_smoke=False, rounds=1, load_s=2.0, poisson_s=2.0)
    misses = []
    for _ in range(ATTEMPTS):
        found = synthetic_round(server.url, opts)
        assert found["plan"]["kind"] == "one-shot" and found["plan"]["max_batch"] == 16
        missed = [f"{k} {found[k]}" for k in ("throughput", "p99_ms") if not found[k]["within_20"]]
        if not missed:
            return
        misses += missed
    pytest.fail("no round landed within 20 % of the plan:\n" + "\n".join(misses))
