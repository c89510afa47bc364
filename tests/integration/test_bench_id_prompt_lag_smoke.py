"""The token-id-prompt loop-lag benchmark's smoke mode runs end to end and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_smoke import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_writes_json_and_png(tmp_path: Path) -> None:
    out = run_smoke("bench.id_prompt_lag", tmp_path)
    result = json.loads((out / "id_prompt_lag.json").read_text())
    names = ("idle", "parse", "serve")
    assert set(result["summary"]) == {"body_mb"} | {
        f"{name}_gap_{kind}_ms" for name in names for kind in ("median", "max")
    }
    (run,) = result["runs"]
    assert run["serve"]["outcome"] == 400 and run["parse"]["outcome"] == "parsed"
    assert all(run[name]["longest_gap_ms"] >= 0 for name in names)
    assert (out / "id_prompt_lag.png").stat().st_size > 0
