"""The plan-accuracy benchmark: its smoke mode calibrates both models and measures both."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bench.plan_accuracy import callers_back_to_back, compared, parse_options, summarize

from tests.bench_smoke import run_smoke
from tests.virtual_time import run_virtual


@pytest.mark.slow
def test_smoke_plans_and_measures_both_models(tmp_path: Path) -> None:
    out_dir = run_smoke("bench.plan_accuracy", tmp_path)
    result = json.loads((out_dir / "plan_accuracy.json").read_text())
    assert (out_dir / "plan_accuracy.png").stat().st_size > 0
    assert result["inputs"]["is_smoke"] is True
    for model, kind in (("synthetic", "one-shot"), ("tiny_llama", "generative")):
        (one,) = result["runs"][model]
        assert one["plan"]["kind"] == kind
        for figure in ("throughput", "p99_ms"):
            assert one[figure]["planned"] > 0 and one[figure]["measured"] > 0, one
        assert result["summary"][model]["p99_ms"]["rounds"] == 1
        assert 0 < one["plan"]["calibration_s"] <= 150  # the default budget, and start-up


def test_figures_are_compared_as_measured_over_planned() -> None:
    assert compared(100.0, 115.0) == {"planned": 100.0, "measured": 115.0, "ratio": 1.15,
                                      "within_20": True}  # fmt: skip
    assert not compared(100.0, 79.0)["within_20"] and not compared(None, 5.0)["within_20"]
    failed = compared(100.0, float("inf"))  # a round whose requests failed: a miss
    assert failed == {"planned": 100.0, "measured": None, "ratio": None, "within_20": False}
    rounds = [{"throughput": compared(10, 9), "p99_ms": compared(10, 13)},
              {"throughput": compared(10, 11), "p99_ms": compared(10, 11)}]  # fmt: skip
    summary = summarize(rounds)
    assert summary["p99_ms"] == {"median_ratio": 1.2, "ratios": [1.3, 1.1],
                                 "rounds_within_20": 1, "rounds": 2}  # fmt: skip
    assert summary["rounds_both_within_20"] == 1  # the first round misses its p99
    assert parse_options(["--smoke"]).rounds == 1


def test_callers_back_to_back_count_every_success() -> None:
    calls = 0

    async def send() -> bool:
        nonlocal calls
        calls += 1
        mine = calls
        await asyncio.sleep(0.01)
        return mine % 10 != 0  # every tenth fails

    done = run_virtual(callers_back_to_back(send, 4, 1.0))
    assert calls == 400 and done == 360
