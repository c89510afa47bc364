"""The batch-1 decode-bound benchmark (part of the GPU device check) runs end to end on the
CPU in smoke mode and reports the step time, the bound and the ratio between them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_smoke import run_smoke


@pytest.mark.slow
def test_smoke_reports_the_step_time_against_the_weight_streaming_bound(
    tmp_path: Path,
) -> None:
    out = run_smoke("bench.decode_bound", tmp_path)
    result = json.loads((out / "decode_bound.json").read_text())
    assert result["weight_bytes"] > 0
    assert result["bound_ms"] == pytest.approx(
        1000 * result["weight_bytes"] / (result["bandwidth_tb_s"] * 1e12), rel=1e-3
    )
    found = result["result"]
    assert found["num_output_tokens"] == 8
    assert 0 < found["step_ms_p50"] <= found["step_ms_p90"]
    (goal,) = result["goals"]
    assert goal["value"] == pytest.approx(found["step_ms_p50"] / result["bound_ms"], rel=0.01)
    assert set(found["step_phases"]) == {"schedule", "prepare", "forward", "sample", "postprocess"}
