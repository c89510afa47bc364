"""The simulator-accuracy bench runs in smoke mode and compares every figure it names."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_smoke import run_smoke


def test_smoke_compares_measured_and_simulated_figures(tmp_path: Path) -> None:
    out = run_smoke("bench.sim_accuracy", tmp_path)
    result = json.loads((out / "sim_accuracy.json").read_text())
    assert set(result["cases"]) == {"saturation", "worker_killed"}
    for figures in result["cases"].values():
        for name, figure in figures.items():
            assert figure["simulated"] is not None, name
    assert result["cases"]["worker_killed"]["failed"]["simulated"] == 0
    assert (out / "sim_accuracy.png").is_file()
