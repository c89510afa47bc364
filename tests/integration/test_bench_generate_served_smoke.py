"""The served generation benchmark: its smoke run serves a random tiny Llama with Conveyor and
drives it over HTTP; its pure pieces (peers found missing, the client's command line, the
summary over rounds) compute what they say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench.generate_served import (
    CONVEYOR,
    CONVEYOR_BASELINE,
    CONVEYOR_COMPILED,
    FIGURES,
    LLAMACPP,
    VLLM,
    conveyor_argv,
    missing_peers,
    parse_args,
    summarise,
    vllm_client_argv,
)

from tests.bench_smoke import run_smoke


@pytest.fixture(scope="module")
def smoke_result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """Run ``python -m bench.generate_served --smoke`` once into a fresh folder."""
    out_dir = run_smoke("bench.generate_served", tmp_path_factory.mktemp("bench-served"))
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


def test_missing_peers_are_skipped_with_a_reason(tmp_path: Path) -> None:
    settings, _ = parse_args(
        ["--contenders", f"{CONVEYOR},{CONVEYOR_BASELINE},{VLLM},{LLAMACPP}",
         "--vllm-venv", str(tmp_path / "none")]
    )  # fmt: skip
    missing = missing_peers(settings)
    assert set(missing) == {CONVEYOR_BASELINE, VLLM, LLAMACPP}
    assert "make vllm-env" in missing[VLLM]
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
    argv = vllm_client_argv(settings, tmp_path, 8123, 16, 64, tmp_path / "out.json")
    text = " ".join(argv)
    assert "--ignore-eos" in argv
    assert "--max-concurrency 16" in text
    assert "--num-prompts 64" in text
    assert "--random-input-len 128" in text
    assert "--base-url http://127.0.0.1:8123" in text


def test_summary_is_the_median_and_range_over_rounds() -> None:
    def run(throughput: float) -> dict[int, dict[str, Any]]:
        return {16: {figure: throughput for figure in FIGURES}}

    summary = summarise({CONVEYOR: [run(10.0), run(30.0), run(20.0)]})
    cell = summary[CONVEYOR]["c16"]["output_throughput"]
    assert cell == {"median": 20.0, "min": 10.0, "max": 30.0}
