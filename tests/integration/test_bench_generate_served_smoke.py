"""The served generation benchmark: its smoke run serves a random tiny Llama with Conveyor and
drives it over HTTP with both workloads, runs hf_static on it in-process, and skips the
peers that are absent with their reasons; its pure pieces (peers found missing, the
client's command line, the summary over rounds) compute what they say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.generate_served import parse_args, summarise
from bench.served_clients import vllm_client_argv
from bench.served_peers import conveyor_argv, missing_peers
from bench.served_settings import (
    CONVEYOR,
    CONVEYOR_BASELINE,
    CONVEYOR_COMPILED,
    FIGURES,
    HF_STATIC,
    LLAMACPP,
    RANDOM,
    VLLM,
    Point,
)

from tests.bench_smoke import run_smoke

ABSENT = "/nonexistent-bench-peer"


@pytest.fixture(scope="module")
def smoke_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """Run ``python -m bench.generate_served --smoke`` once into a fresh folder, every
    contender asked for and both workloads, vLLM and llama.cpp pointed at no environment."""
    out_dir = run_smoke(
        "bench.generate_served", tmp_path_factory.mktemp("bench-served"),
        "--contenders", f"{CONVEYOR},{VLLM},{LLAMACPP},{HF_STATIC}", "--workload", "random,chat",
        "--vllm-venv", ABSENT, "--llamacpp-venv", ABSENT,
    )  # fmt: skip
    return json.loads((out_dir / "generate_served.json").read_text()), out_dir


@pytest.mark.slow
def test_smoke_serves_conveyor_and_reports_every_figure(
    smoke_result: tuple[dict[str, Any], Path],
) -> None:
    result, out_dir = smoke_result
    assert result["client"] == "builtin"
    (run,) = result["runs"][CONVEYOR]
    assert run["c4"]["completed"] == 8
    cell = result["results"][CONVEYOR]["c4"]
    assert cell["output_throughput"]["median"] > 0
    assert set(cell) == set(FIGURES) - {"p99_itl_ms"}  # the built-in client has no ITLs
    assert (out_dir / "generate_served.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.slow
def test_smoke_runs_the_chat_workload_with_every_figure(
    smoke_result: tuple[dict[str, Any], Path],
) -> None:
    result, _ = smoke_result
    assert result["inputs"]["workloads"] == ["random", "chat"]
    assert result["points"] == ["c4", "chat_r8"]
    (run,) = result["runs"][CONVEYOR]
    assert (run["chat_r8"]["completed"], run["chat_r8"]["failed"]) == (8, 0)
    cell = result["results"][CONVEYOR]["chat_r8"]
    assert set(cell) == set(FIGURES)  # the chat client times every streamed token
    assert cell["p99_itl_ms"]["median"] >= cell["p50_itl_ms"]["median"] > 0


@pytest.mark.slow
def test_smoke_runs_hf_static_and_skips_absent_peers_with_reasons(
    smoke_result: tuple[dict[str, Any], Path],
) -> None:
    result, _ = smoke_result
    (run,) = result["runs"][HF_STATIC]
    assert set(run) == {"c4"}  # no chat: it has no server
    assert run["c4"]["completed"] == 8
    assert set(result["results"][HF_STATIC]["c4"]) == set(FIGURES)
    skipped = result["skipped"]
    assert set(skipped) == {VLLM, LLAMACPP, f"{HF_STATIC}/chat"}
    assert "make vllm-env" in skipped[VLLM]
    assert "make llamacpp-env" in skipped[LLAMACPP]
    assert "no server" in skipped[f"{HF_STATIC}/chat"]


def test_missing_peers_are_skipped_with_a_reason(tmp_path: Path) -> None:
    settings, _ = parse_args(
        ["--contenders", f"{CONVEYOR},{CONVEYOR_BASELINE},{VLLM},{LLAMACPP}",
         "--vllm-venv", str(tmp_path / "none"), "--llamacpp-venv", str(tmp_path / "none")]
    )  # fmt: skip
    missing = missing_peers(settings)
    assert set(missing) == {CONVEYOR_BASELINE, VLLM, LLAMACPP}
    assert "make vllm-env" in missing[VLLM]
    assert "make llamacpp-env" in missing[LLAMACPP]
    assert "--baseline-src" in missing[CONVEYOR_BASELINE]


def test_the_compiled_contender_turns_the_compiled_path_on(tmp_path: Path) -> None:
    settings, _ = parse_args(["--contenders", f"{CONVEYOR},{CONVEYOR_COMPILED}"])
    assert not missing_peers(settings)
    for compiled, expected in ((False, None), (True, False)):
        conveyor_argv(settings, tmp_path / "model", tmp_path, 8000, compiled=compiled)
        (model,) = yaml.safe_load((tmp_path / "conveyor.yaml").read_text())["models"]
        assert model.get("enforce_eager") is expected


def test_the_vllm_client_runs_the_issue_workload(tmp_path: Path) -> None:
    settings, _ = parse_args([])
    assert (settings.input_len, settings.output_len, settings.num_requests) == (128, 128, 64)
    assert settings.concurrencies == (16, 64)
    point = Point(RANDOM, concurrency=16)
    argv = vllm_client_argv(tmp_path / "vllm", settings, tmp_path, 8123, point, 64,
                            tmp_path / "out.json")  # fmt: skip
    text = " ".join(argv)
    assert "--ignore-eos" in argv
    assert "--max-concurrency 16" in text
    assert "--num-prompts 64" in text
    assert "--random-input-len 128" in text
    assert "--base-url http://127.0.0.1:8123" in text


def test_summary_is_the_median_and_range_over_rounds() -> None:
    def run(throughput: float) -> dict[str, dict[str, Any]]:
        return {"c16": {figure: throughput for figure in FIGURES}}

    summary = summarise({CONVEYOR: [run(10.0), run(30.0), run(20.0)]})
    cell = summary[CONVEYOR]["c16"]["output_throughput"]
    assert cell == {"median": 20.0, "min": 10.0, "max": 30.0}
