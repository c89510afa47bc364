"""The prefix-routing scenarios benchmark: its smoke mode runs end to end; its summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.prefix_scenarios import GOALS, SCENARIOS, NoOverlapPlan, parse_options, summarize

from tests.bench_smoke import run_smoke
from tests.postgres import require_postgres


@pytest.mark.slow
@pytest.mark.postgres
def test_smoke_runs_a_scenario_before_and_after_and_the_no_overlap_pair(tmp_path: Path) -> None:
    require_postgres()
    out = run_smoke("bench.prefix_scenarios", tmp_path)
    result: dict[str, Any] = json.loads((out / "prefix_scenarios.json").read_text())
    before, after = result["runs"]["no_hint"]["before"], result["runs"]["no_hint"]["after"]
    assert before["num_failed"] == after["num_failed"] == 0
    assert 0 <= before["prefix_cache_hit_rate"] <= 1 and 0 <= after["prefix_cache_hit_rate"] <= 1
    assert set(result["runs"]["no_overlap"]) == {"load_only", "prefix"}
    assert 0 <= result["summary"]["ceiling_hit_rate"] <= 1
    assert result["summary"]["no_overlap"]["throughput_ratio"] > 0
    assert (out / "prefix_scenarios.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def _run(hit: float, rate: float = 10.0) -> dict[str, Any]:
    return {
        "prefix_cache_hit_rate": hit, "ttft_ms": {"p50": 100.0}, "in_flight": {"mean_gap": 1.0},
        "routed_by": {"prefix": 3}, "requests_per_s": rate,
    }  # fmt: skip


def test_summary_checks_each_goal_and_the_throughput_tolerance() -> None:
    results: dict[str, Any] = {
        name: {"before": _run(0.3), "after": _run(GOALS[name])} for name in SCENARIOS
    }
    results["ceiling"] = _run(0.7)
    results["no_hint"]["after"] = _run(0.44)
    results["no_overlap"] = {"load_only": [_run(0, 10.0), _run(0, 10.2)],
                             "prefix": [_run(0, 9.8), _run(0, 9.9)]}  # fmt: skip
    summary = summarize(results)
    assert summary["ceiling_hit_rate"] == 0.7
    assert summary["no_hint"]["met"] is False and summary["prompt_cache_key"]["met"] is True
    assert summary["two_gateways"]["hit_rate_before"] == 0.3
    # The median of the pairs' ratios (0.98, 0.971), not of each mode's median.
    assert summary["no_overlap"]["pair_ratios"] == [0.98, 0.971]
    assert summary["no_overlap"]["throughput_ratio"] == round((0.98 + 0.971) / 2, 3)
    assert summary["no_overlap"]["met"] is True


def test_the_pairs_ratio_cancels_a_drift_that_the_medians_keep() -> None:
    # The machine slows down run by run; each pair runs at the same speed, 1 % apart.
    load_only = [_run(0, rate) for rate in (20.0, 15.0, 10.0, 8.0)]
    prefix = [_run(0, rate * 0.99) for rate in (20.0, 15.0, 10.0, 8.0)]
    summary = summarize({"no_overlap": {"load_only": load_only, "prefix": prefix}})
    assert "ceiling_hit_rate" not in summary  # --only-no-overlap: no hit-rate scenarios ran
    assert summary["no_overlap"]["throughput_ratio"] == 0.99
    assert summary["no_overlap"]["met"] is True
    slower = {
        "load_only": load_only,
        "prefix": [_run(0, r * 0.96) for r in (20.0, 15.0, 10.0, 8.0)],
    }
    assert summarize({"no_overlap": slower})["no_overlap"]["met"] is False


def test_only_no_overlap_runs_the_pair_alone_with_its_sessions_and_repeats() -> None:
    base, plan = parse_options(
        ["--only-no-overlap", "--repeats", "7", "--no-overlap-sessions", "96"]
    )
    assert plan == NoOverlapPlan(repeats=7, no_overlap_sessions=96, only_no_overlap=True)
    assert base.num_workers == 3 and not base.is_smoke
    _, smoke = parse_options(["--smoke"])
    assert smoke.repeats == 1 and not smoke.only_no_overlap
