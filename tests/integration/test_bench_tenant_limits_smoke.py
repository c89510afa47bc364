"""The tenant-limits benchmark: its smoke mode runs end to end and reports both costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.tenant_limits import parse_options, summarize

from tests.bench_smoke import run_smoke
from tests.postgres import require_postgres
from tests.redis_server import unique_prefix


@pytest.mark.slow
@pytest.mark.postgres
def test_smoke_reports_serve_and_gateway_with_limits_on_and_off(tmp_path: Path) -> None:
    require_postgres()
    with unique_prefix():  # skips without Redis
        out_dir = run_smoke("bench.tenant_limits", tmp_path)
    result = json.loads((out_dir / "tenant_limits.json").read_text())
    assert (out_dir / "tenant_limits.png").stat().st_size > 0
    assert result["inputs"]["is_smoke"] is True
    for kind in ("serve", "gateway"):
        summary = result[kind]["summary"]
        assert all(v > 0 for v in summary["throughput_per_s"].values()), summary
        assert summary["num_errors"] == {"off": 0, "on": 0}
        assert all(v > 0 for v in summary["server_cpu_us_per_request"].values()), summary
        assert isinstance(summary["cost_passed"], bool)
        # Local shares: a few Redis round trips a second, not one per admission or batch of
        # admissions (without shares this smoke run measures 0.16-0.3 a request).
        assert 0 < summary["redis_script_calls_per_request"]["on"] < 0.05, summary


def test_smoke_options_are_short(tmp_path: Path) -> None:
    opts = parse_options(["--smoke", f"--out={tmp_path}"])
    assert opts.is_smoke and opts.seconds <= 1 and opts.rounds == 1 and opts.out_dir == tmp_path


def test_the_cost_is_the_median_of_each_round_s_own_cost() -> None:
    def run(tput: float) -> dict[str, float]:
        return {"throughput_per_s": tput, "server_cpu_us_per_request": 100.0,
                "redis_script_calls_per_request": 0.0, "num_errors": 0}  # fmt: skip

    # The machine speeds up between rounds; within each round "on" costs 5 %, 10 %, 5 %.
    runs = {"off": [run(1000), run(2000), run(4000)], "on": [run(950), run(1800), run(3800)]}
    summary = summarize(runs)
    assert summary["round_costs"] == [0.05, 0.1, 0.05]
    assert summary["cost"] == 0.05 and summary["cost_passed"]
    assert summary["cost_of_medians"] == 0.1  # 1 - 1800 / 2000: the drift, not the limits
