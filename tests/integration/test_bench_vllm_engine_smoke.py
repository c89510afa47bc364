"""The Conveyor-on-vLLM benchmark's pure pieces: both servers get the same engine arguments,
the summary computes the two goals from the runs, and the plot is written.

A real run starts two vLLM engines (minutes on two cores), so it is left to the benchmark
itself (``python -m bench.vllm_engine``, in vLLM's environment)."""

from __future__ import annotations

from pathlib import Path

import yaml
from bench.vllm_engine import (
    CONVEYOR,
    ENGINE,
    VLLM,
    VLLM_EXTRA,
    conveyor_argv,
    summarize,
    write_png,
)


def run(tokens_per_s: float, ttft_ms: float) -> dict[str, dict[str, float]]:
    return {"burst": {"output_tokens_per_s": tokens_per_s}, "paced": {"ttft_p50_ms": ttft_ms}}


def test_the_summary_compares_medians_against_the_goals(tmp_path: Path) -> None:
    runs = {
        VLLM: [run(100.0, 20.0), run(90.0, 22.0), run(110.0, 21.0)],
        CONVEYOR: [run(96.0, 24.0), run(97.0, 30.0), run(80.0, 26.0)],
    }
    summary = summarize(runs)
    assert summary[VLLM]["output_tokens_per_s"] == 100.0
    assert summary[CONVEYOR]["output_tokens_per_s_range"] == [80.0, 97.0]
    throughput, ttft = summary["goals"]
    assert throughput["value"] == 0.96 and throughput["is_met"]
    assert ttft["value"] == 5.0 and ttft["is_met"]
    write_png(tmp_path / "vllm_engine.png", summary)
    assert (tmp_path / "vllm_engine.png").stat().st_size > 0


def test_conveyor_gets_the_engine_arguments_vllm_serve_gets(tmp_path: Path) -> None:
    argv = conveyor_argv(tmp_path / "model", tmp_path, 8123)
    config = yaml.safe_load((tmp_path / "conveyor.yaml").read_text())
    (model,) = config["models"]
    assert model["engine"] == "vllm" and model["vllm"] == VLLM_EXTRA
    assert {key: model[key] for key in ENGINE} == ENGINE
    assert argv[-2:] == ["--port", "8123"]
