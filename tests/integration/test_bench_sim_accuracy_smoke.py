"""The simulator-accuracy bench runs in smoke mode (the committed measurements, short
simulated runs) and compares every figure it names."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_smoke import run_smoke


def test_smoke_compares_measured_and_simulated_figures(tmp_path: Path) -> None:
    out = run_smoke("bench.sim_accuracy", tmp_path)
    result = json.loads((out / "sim_accuracy.json").read_text())
    cases = result["cases"]
    assert set(cases) == {"saturation", "worker_killed", "steady_50", "steady_90",
                          "overload_2x", "chat"}  # fmt: skip
    for figures in cases.values():
        for name, figure in figures.items():
            assert figure["simulated"] is not None, name
    assert cases["worker_killed"]["failed"]["simulated"] == 0
    assert cases["overload_2x"]["rejected_429"]["simulated"] > 0
    assert 0 < cases["chat"]["prefix_hit_ratio"]["simulated"] < 1
    assert result["calibration"]["one_shot"]["one_shot"]["fixed_s"] > 0
    assert (out / "sim_accuracy.png").is_file()
