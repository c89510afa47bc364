"""The generation benchmark's smoke mode runs every contender end to end and reports every
figure; its pure pieces (workload, percentiles, goals) compute what they say, and its SmolLM2
case reads the bundled GGUF on its own workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.generate import (
    CONTENDERS,
    PATTERNS,
    SMOLLM2_WORKLOAD,
    BenchRequest,
    RequestTiming,
    build_model,
    goals,
    parse_args,
    percentile,
    result_name,
    step_phases,
    with_rate,
)

from conveyor.config.model_config import bundled_chat_model_path
from conveyor.observability.metrics import STEP_PHASES
from tests.bench_smoke import run_smoke

SUMMARY_FIELDS = {
    "num_requests", "num_output_tokens", "output_tokens_per_s", "ttft_p50_ms", "ttft_p95_ms",
    "tpot_p50_ms", "tpot_p95_ms", "latency_p50_ms", "latency_p95_ms", "kv",
}  # fmt: skip


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``python -m bench.generate --smoke`` once into a fresh folder."""
    out_dir = tmp_path_factory.mktemp("bench-generate")
    return run_smoke("bench.generate", out_dir)


@pytest.fixture(scope="module")
def smoke_result(smoke_out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((smoke_out / "generate.json").read_text())
    return result


@pytest.mark.slow
def test_smoke_reports_every_contender_and_pattern(smoke_result: dict[str, Any]) -> None:
    assert smoke_result["inputs"]["is_smoke"] is True
    for pattern in PATTERNS:
        assert set(smoke_result["results"][pattern]) == set(CONTENDERS)
        for contender in CONTENDERS:
            summary = smoke_result["results"][pattern][contender]
            assert set(summary) >= SUMMARY_FIELDS, (pattern, contender)
            assert summary["num_requests"] == 8
            assert summary["output_tokens_per_s"] > 0


@pytest.mark.slow
def test_smoke_accounts_for_the_kv_cache(smoke_result: dict[str, Any]) -> None:
    for pattern in PATTERNS:
        kv = smoke_result["results"][pattern]["conveyor"]["kv"]
        assert kv["max_kv_blocks_used"] > 0
        assert kv["kv_blocks_used_after"] == 0  # every block came back
        assert smoke_result["results"][pattern]["hf_static"]["kv"]["max_kv_tokens_allocated"] > 0


@pytest.mark.slow
def test_smoke_splits_the_engine_step_into_phases(smoke_result: dict[str, Any]) -> None:
    for pattern in PATTERNS:
        phases = smoke_result["results"][pattern]["conveyor"]["kv"]["step_phases"]
        assert list(phases) == list(STEP_PHASES)
        assert phases["forward"]["total_s"] > 0
        assert sum(times["share"] for times in phases.values()) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_smoke_evaluates_the_goals_and_writes_a_png(
    smoke_result: dict[str, Any], smoke_out: Path
) -> None:
    assert {goal["name"] for goal in smoke_result["goals"]} == {
        "burst.throughput_over_static",
        "burst.cpu_throughput_over_static",
        *(f"{pattern}.ttft_p95_below_static" for pattern in PATTERNS),
    }
    assert all(isinstance(goal["passed"], bool) for goal in smoke_result["goals"])
    assert (smoke_out / "generate.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_steady_arrivals_are_evenly_spaced() -> None:
    requests = [BenchRequest(i, [5] * 3, 4) for i in range(4)]
    assert [r.arrival_s for r in with_rate(requests, 2.0)] == [0.0, 0.5, 1.0, 1.5]


def test_request_timing_and_percentiles() -> None:
    timing = RequestTiming(arrival_s=1.0, token_times_s=[1.5, 1.7, 1.9])
    assert timing.ttft_s == pytest.approx(0.5)
    assert timing.tpot_s == pytest.approx(0.2)
    assert RequestTiming(0.0, [0.1]).tpot_s is None
    assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    assert percentile([], 0.5) is None


def test_step_phases_are_the_run_s_difference_per_step_and_share() -> None:
    before = {"schedule": 1.0, "forward": 2.0}
    after = {"schedule": 1.5, "forward": 3.5}
    phases = step_phases(after, before, num_steps=10)
    assert phases["schedule"] == {"total_s": 0.5, "ms_per_step": 50.0, "share": 0.25}
    assert phases["forward"] == {"total_s": 1.5, "ms_per_step": 150.0, "share": 0.75}


def test_goals_compare_with_static_batching() -> None:
    def summary(tok_per_s: float, ttft_p95_ms: float) -> dict[str, Any]:
        return {"output_tokens_per_s": tok_per_s, "ttft_p95_ms": ttft_p95_ms}

    runs = {"conveyor": summary(300.0, 50.0), "hf_static": summary(100.0, 60.0)}
    runs["conveyor"]["output_tokens_per_cpu_s"] = 200.0
    runs["hf_static"]["output_tokens_per_cpu_s"] = 100.0
    found = {goal["name"]: goal for goal in goals({"burst": runs, "steady": runs})}
    assert found["burst.throughput_over_static"]["passed"]
    assert found["burst.throughput_over_static"]["value"] == 3.0
    assert found["steady.ttft_p95_below_static"]["passed"]
    assert found["burst.cpu_throughput_over_static"]["value"] == 2.0
    assert not found["burst.cpu_throughput_over_static"]["passed"]
    assert "steady.throughput_over_static" not in found  # a fixed offered rate: not compared


def test_the_smollm2_case_runs_the_bundled_gguf_on_its_own_workload(tmp_path: Path) -> None:
    settings, _, _ = parse_args(["--model", "smollm2", "--num-requests", "5"])
    assert build_model(settings, tmp_path) == bundled_chat_model_path()
    assert not list(tmp_path.iterdir())  # nothing built
    assert result_name(settings) == "generate_smollm2"
    # Its workload, except what the command line set.
    assert settings.num_requests == 5
    assert settings.prompt_tokens == SMOLLM2_WORKLOAD["prompt_tokens"]
    assert settings.sequential_requests == SMOLLM2_WORKLOAD["sequential_requests"]
    default, _, _ = parse_args([])
    assert result_name(default) == "generate" and default.num_requests == 128
