"""The prefix-routing benchmark: its smoke mode runs end to end and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.prefix_routing import MODES, evaluate, in_flight_figures, parse_options, percentile

from tests.bench_smoke import run_smoke
from tests.postgres import require_postgres


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``python -m bench.prefix_routing --smoke`` once into a fresh folder."""
    require_postgres()
    out_dir = tmp_path_factory.mktemp("bench-prefix-routing")
    return run_smoke("bench.prefix_routing", out_dir)


@pytest.mark.slow
@pytest.mark.postgres
def test_smoke_reports_both_modes(smoke_out: Path) -> None:
    result: dict[str, Any] = json.loads((smoke_out / "prefix_routing.json").read_text())
    assert result["inputs"]["is_smoke"] is True
    for mode in MODES:
        (run,) = result["runs"][mode]
        assert run["num_requests"] == 12 and run["num_failed"] == 0
        assert 0 <= run["prefix_cache_hit_rate"] <= 1
        assert 0 < run["ttft_ms"]["p50"] <= run["ttft_ms"]["p99"]
        assert abs(sum(run["request_share"].values()) - 1) < 0.01
        assert run["in_flight"]["num_samples"] > 0
        assert run["in_flight"]["mean_gap"] >= 0
    assert result["runs"]["load_only"][0]["routed_by"] == {"load": 12}
    assert result["runs"]["prefix"][0]["routed_by"].get("prefix", 0) > 0
    assert isinstance(result["summary"]["gap_within_bound"], bool)
    assert (smoke_out / "prefix_routing.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def _run(hit: float, p50: float, gap: float, rate: float = 10.0) -> dict[str, Any]:
    return {
        "prefix_cache_hit_rate": hit, "ttft_ms": {"p50": p50, "p99": 2 * p50},
        "worst_share": 0.4, "in_flight": {"mean_gap": gap}, "requests_per_s": rate,
    }  # fmt: skip


def test_evaluate_compares_the_modes_and_checks_the_bound() -> None:
    runs = {"load_only": [_run(0.3, 200, 2)], "prefix": [_run(0.8, 100, 4)]}
    summary = evaluate(runs, load_bound=4)
    assert summary["ttft_p50_ratio"] == 0.5
    assert summary["prefix"]["prefix_cache_hit_rate"] == 0.8
    assert summary["gap_within_bound"] is True
    over = evaluate({**runs, "prefix": [_run(0.8, 100, 4.5)]}, load_bound=4)
    assert over["gap_within_bound"] is False
    assert (
        evaluate({**runs, "prefix": [_run(0.8, 100, 4, rate=9.7)]}, 4)["throughput_ratio"] == 0.97
    )


def test_evaluate_takes_one_mode_alone() -> None:
    summary = evaluate({"prefix": [_run(0.5, 100, 1)]}, load_bound=4)
    assert summary["prefix"]["prefix_cache_hit_rate"] == 0.5 and "load_only" not in summary
    assert summary["gap_within_bound"] is True and "ttft_p50_ratio" not in summary


def test_in_flight_figures_average_per_worker() -> None:
    samples = [{"a": 4, "b": 0}, {"a": 2, "b": 2}, {"a": 0, "b": 1}]
    figures = in_flight_figures(samples)
    assert figures["mean_per_worker"] == {"a": 2.0, "b": 1.0}
    assert figures["mean_gap"] == 1.0
    assert figures["instant_gap"]["max"] == 4 and figures["num_samples"] == 3


def test_percentiles_by_nearest_rank() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile(list(range(1, 101)), 0.99) == 99


def test_options_shrink_for_smoke_and_take_flags(tmp_path: Path) -> None:
    smoke = parse_options(["--smoke", f"--out={tmp_path}"])
    assert (smoke.num_sessions, smoke.num_turns, smoke.out_dir) == (4, 3, tmp_path)
    full = parse_options(["--sessions", "8", "--turns", "4", "--repeats", "3", "--load-bound", "2"])
    assert (full.num_sessions, full.num_turns, full.repeats, full.load_bound) == (8, 4, 3, 2)
    assert (full.hint, full.concurrency, full.num_gateways, full.modes) == ("user", None, 1, MODES)
    issue = parse_options(["--concurrency", "6", "--hint", "none", "--gateways", "2",
                           "--routed-blocks", "0", "--no-system-prompt", "--modes", "prefix"])  # fmt: skip
    assert (issue.concurrency, issue.hint, issue.num_gateways, issue.routed_blocks) == (
        6, "none", 2, 0)  # fmt: skip
    assert issue.has_system_prompt is False and issue.modes == ("prefix",)
    assert issue.traffic().hint == "none"
