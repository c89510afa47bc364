"""The online benchmark: its smoke mode runs end to end and reports every figure; its
pure pieces (percentiles, response framing, goals, saturation) compute what they say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.loadgen import content_length, percentile
from bench.online import (
    FIGURE_NAMES,
    GOAL_NAMES,
    HALF_LOAD,
    Goal,
    RunRecord,
    figure,
    make_sentences,
    saturation_by_rep,
)

from tests.bench_smoke import run_smoke

FIGURE_FIELDS = {"unit", "median", "min", "max", "num_runs", "runs", "reference", "ratio"}


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``python -m bench.online --smoke`` once into a fresh folder."""
    out_dir = tmp_path_factory.mktemp("bench-online")
    return run_smoke("bench.online", out_dir)


@pytest.fixture(scope="module")
def smoke_result(smoke_out: Path) -> dict[str, Any]:
    """The smoke run's JSON document."""
    result: dict[str, Any] = json.loads((smoke_out / "online.json").read_text())
    return result


@pytest.mark.slow
def test_smoke_reports_every_figure(smoke_result: dict[str, Any]) -> None:
    figures = smoke_result["figures"]
    assert set(FIGURE_NAMES) <= set(figures)
    for name in FIGURE_NAMES:
        assert set(figures[name]) >= FIGURE_FIELDS, name
        assert figures[name]["num_runs"] == len(figures[name]["runs"]), name


@pytest.mark.slow
def test_smoke_measures_the_ceilings(smoke_result: dict[str, Any]) -> None:
    figures = smoke_result["figures"]
    for name in ("http.ceiling_per_s", "minilm.raw_ceiling_per_s", "synthetic.raw_ceiling_per_s"):
        assert figures[name]["num_runs"] == 1, name
        assert figures[name]["median"] > 0, name


@pytest.mark.slow
def test_smoke_evaluates_every_goal(smoke_result: dict[str, Any]) -> None:
    goals = {goal["name"]: goal for goal in smoke_result["goals"]}
    assert set(goals) == set(GOAL_NAMES)
    for goal in goals.values():
        assert isinstance(goal["passed"], bool)
        assert goal["target"] > 0


@pytest.mark.slow
def test_smoke_records_inputs_machine_and_runs(smoke_result: dict[str, Any]) -> None:
    assert smoke_result["inputs"]["is_smoke"] is True
    assert smoke_result["versions"]["conveyor"] is not None
    assert smoke_result["machine"]["num_cpus"] >= 1
    reps = {run["rep"] for run in smoke_result["runs"]}
    assert reps == {-1, 0}  # one discarded warm-up, one counted run
    assert "was_busy" in smoke_result["quiet"]
    half_load = [r for r in smoke_result["runs"] if r["mode"] == "open"]
    assert half_load and all(r["fraction"] == HALF_LOAD for r in half_load)


@pytest.mark.slow
def test_smoke_writes_a_png(smoke_out: Path) -> None:
    assert (smoke_out / "online.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([], 0.5) is None


def test_content_length_is_found_in_any_case() -> None:
    head = bytearray(b"HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n")
    assert content_length(head, head.find(b"\r\n\r\n")) == 42
    head = bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n")
    assert content_length(head, head.find(b"\r\n\r\n")) == 7
    head = bytearray(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert content_length(head, head.find(b"\r\n\r\n")) == -1


def test_goal_margin_sign_follows_the_direction() -> None:
    at_least = Goal("g", "share", 0.93, 0.9, is_at_most=False)
    at_most = Goal("h", "p99", 40.0, 35.0, is_at_most=True)
    assert at_least.passed and at_least.margin == pytest.approx(0.03)
    assert not at_most.passed and at_most.margin == pytest.approx(-5.0)
    assert not Goal("i", "unmeasured", None, 1.0, is_at_most=False).passed


def test_saturation_takes_closed_loop_or_sustained_open_loop() -> None:
    records = [
        RunRecord(-1, "c", "closed", 999.0),  # warm-up: ignored
        RunRecord(0, "c", "closed", 100.0),
        RunRecord(0, "c", "open", 120.0, fraction=0.5, offered_per_s=120.0),
        RunRecord(0, "c", "open", 130.0, fraction=0.9, offered_per_s=200.0, is_sustained=False),
        RunRecord(1, "c", "closed", 90.0),
    ]
    assert saturation_by_rep(records, "c") == {0: 120.0, 1: 90.0}


def test_figure_ratios_are_paired_by_run() -> None:
    fig = figure({0: 90.0, 1: 50.0}, "inputs/s", reference="r", ref_values={0: 100.0, 1: 50.0})
    assert fig["median"] == 70.0
    assert fig["ratio"] == {"median": 0.95, "min": 0.9, "max": 1.0}


def test_sentences_are_varied_and_deterministic() -> None:
    sentences = make_sentences(200)
    assert sentences == make_sentences(200)
    assert len(set(sentences)) > 150
