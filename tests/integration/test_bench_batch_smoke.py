"""The batch benchmark: its smoke mode runs end to end and reports every figure and goal;
its pure pieces (inputs, figures, goals) compute what they say."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from bench.batch import (
    MEMORY_LINE_BYTES,
    ModelResult,
    evaluate_goals,
    memory_requests,
    model_figures,
)

from tests.bench_smoke import run_smoke


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``python -m bench.batch --smoke`` once into a fresh folder."""
    out_dir = tmp_path_factory.mktemp("bench-batch")
    return run_smoke("bench.batch", out_dir)


@pytest.fixture(scope="module")
def smoke_result(smoke_out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((smoke_out / "batch.json").read_text())
    return result


@pytest.mark.slow
def test_smoke_measures_batch_online_soak_and_memory(smoke_result: dict[str, Any]) -> None:
    synthetic = smoke_result["figures"]["models"]["synthetic"]
    assert synthetic["online_saturation_per_s"] > 0 and synthetic["batch_lines_per_s"] > 0
    assert synthetic["batch_over_online"] > 0
    assert synthetic["idle_p99_ms"] > 0 and synthetic["soak_p99_ms"] > 0
    assert synthetic["batch_time_ms"] > 0
    memory = smoke_result["figures"]["memory"]
    assert memory["status"] == "completed" and memory["completed"] == memory["num_lines"]
    assert memory["peak_rss_mb"] >= memory["baseline_rss_mb"] > 0
    runs = smoke_result["runs"]["synthetic"]
    assert runs["batch"][0]["status"] == "completed" and runs["soak"]["was_soaking_throughout"]


@pytest.mark.slow
def test_smoke_evaluates_every_goal(smoke_result: dict[str, Any]) -> None:
    names = {goal["name"] for goal in smoke_result["goals"]}
    assert names == {"synthetic_batch_vs_online", "synthetic_soak_p99_within_one_batch",
                     "memory_peak_increase"}  # fmt: skip
    assert all(isinstance(goal["passed"], bool) for goal in smoke_result["goals"])
    assert smoke_result["inputs"]["is_smoke"] is True
    assert smoke_result["versions"]["conveyor"] is not None


@pytest.mark.slow
def test_smoke_writes_a_png(smoke_out: Path) -> None:
    assert (smoke_out / "batch.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_memory_input_has_the_requested_size() -> None:
    lines = [json.dumps(line) for line in memory_requests("m", 64 * MEMORY_LINE_BYTES)]
    assert len(lines) == 64
    assert all(MEMORY_LINE_BYTES - 200 < len(line) + 1 <= MEMORY_LINE_BYTES for line in lines)
    assert len({json.loads(line)["custom_id"] for line in lines}) == 64


def test_figures_pair_runs_and_goals_follow_them() -> None:
    result = ModelResult("m")
    result.online = [{"rep": 0, "throughput_per_s": 100.0}, {"rep": 1, "throughput_per_s": 200.0}]
    result.batch = [{"rep": 0, "lines_per_s": 95.0}, {"rep": 1, "lines_per_s": 170.0}]
    result.soak = {"idle": {"p99_ms": 30.0}, "soak": {"p99_ms": 45.0}, "batch_time_ms": 20.0}
    figures = model_figures(result)
    assert figures["batch_over_online_runs"] == [0.95, 0.85]
    assert figures["batch_over_online"] == 0.9 and figures["soak_p99_increase_ms"] == 15.0
    memory = {"peak_increase_mb": 20.0, "file_mb": 200.0}
    goals = {g.name: g for g in evaluate_goals({"models": {"m": figures}, "memory": memory})}
    assert goals["m_batch_vs_online"].passed and goals["m_soak_p99_within_one_batch"].passed
    assert goals["memory_peak_increase"].value == 0.1 and goals["memory_peak_increase"].passed
    assert model_figures(ModelResult("g", skipped="501")) == {"skipped": "501"}
    assert list(itertools.islice(memory_requests("m", 10), 2))  # tiny targets still give a line
