"""``conveyor simulate --json`` and the model-pull simulation through the real planner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.sim.distribution import Pull
from conveyor.sim.scenario import DistributionSpec

SCENARIO = """
name: cli
duration_s: 2
time_model: {gpu: h100}
fleet:
  model: {kind: one_shot}
  regions: [{name: a, workers: 2}]
traffic:
  - {kind: poisson, rate_rps: 50, prompt_tokens: {mean: 20}}
"""


def test_json_has_the_headline_figures_and_out_has_the_files(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    out = tmp_path / "out"
    done = CliRunner().invoke(app, ["simulate", str(path), "--seed", "3", "--json",
                                    "--out", str(out)])  # fmt: skip
    assert done.exit_code == 0, done.output
    totals = json.loads(done.output)
    for key in ("requests", "completed", "lost", "duplicated", "rejected_429",
                "throughput_rps", "sim_seconds", "wall_seconds"):  # fmt: skip
        assert key in totals
    assert set(totals["latency_ms"]) == {"p50", "p99"}
    assert totals["completed"] == totals["requests"] > 0
    assert (out / "result.json").is_file() and (out / "result.png").is_file()


def test_a_bad_scenario_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: x\nfleet: {regions: []}\n", encoding="utf-8")
    done = CliRunner().invoke(app, ["simulate", str(path)])
    assert done.exit_code == 2
    assert "conveyor simulate:" in done.output


def test_a_pull_reads_each_chunk_from_the_origin_about_once() -> None:
    spec = DistributionSpec(model_bytes=64 * 2**20 * 10, nodes=32, rack_size=8)
    figures = Pull(spec, seed=1).run()
    assert figures["nodes_ready"] == 32
    assert 1.0 <= figures["origin_egress_models"] < 2.0
    assert figures["all_ready_s"] < figures["direct"]["seconds"]
