"""The fleet benchmark: its smoke mode runs end to end and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.fleet import evaluate, parse_options
from bench.fleet_gateway import summarize

from tests.bench_smoke import run_smoke
from tests.postgres import require_postgres


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run ``python -m bench.fleet --smoke`` once into a fresh folder."""
    require_postgres()
    out_dir = tmp_path_factory.mktemp("bench-fleet")
    return run_smoke("bench.fleet", out_dir)


@pytest.mark.slow
@pytest.mark.postgres
def test_smoke_reports_scaling_and_failover(smoke_out: Path) -> None:
    result: dict[str, Any] = json.loads((smoke_out / "fleet.json").read_text())
    tput = result["summary"]["throughput_per_s"]
    assert set(tput) == {"workers_1", "workers_2", "workers_3", "gateway_ceiling"}
    assert all(value > 0 for value in tput.values())
    assert isinstance(result["summary"]["speedup_2_passed"], bool)
    failover = result["failover"]
    assert failover["time_to_reroute_s"] >= 0
    assert failover["num_failed"] <= failover["num_sent"]
    assert result["inputs"]["is_smoke"] is True
    overhead = result["gateway_overhead"]["summary"]
    assert set(overhead["ratio_to_direct"]) == {"direct", "gateway_1", "gateway_2"}
    assert all(v["median"] > 0 for v in overhead["throughput_per_s"].values())
    assert set(overhead["added_p50_ms"]) == {"gateway_1", "gateway_2"}
    assert set(overhead["added_p50_at_half_own_ceiling_ms"]) == {"gateway_1", "gateway_2"}
    assert set(overhead["near_saturation_at_half_direct"]) == {"gateway_1", "gateway_2"}
    assert overhead["cpu_ms_per_request"]["gateway_1"]["gateway"] > 0
    assert len(result["gateway_overhead"]["inputs"]["gateway_pids"]["gateway_2"]) == 2
    assert (smoke_out / "fleet.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def _run(tput: float) -> dict[str, float]:
    return {"throughput_per_s": tput}


def test_the_speedup_goal_is_capped_by_the_gateway_ceiling() -> None:
    runs = {"workers_1": _run(100), "workers_2": _run(150), "workers_3": _run(160)}
    capped = evaluate({**runs, "gateway_ceiling": _run(150)})
    assert capped["speedup_2_target"] == 1.5 and capped["speedup_2_passed"]
    uncapped = evaluate({**runs, "gateway_ceiling": _run(1000)})
    assert uncapped["speedup_2_target"] == 1.8 and not uncapped["speedup_2_passed"]


def test_smoke_options_are_short(tmp_path: Path) -> None:
    opts = parse_options(["--smoke", f"--out={tmp_path}"])
    assert opts.is_smoke and opts.seconds < 5 and opts.out_dir == tmp_path


def _load(tput: float, p50: float) -> dict[str, Any]:
    return {"throughput_per_s": tput, "p50_ms": p50, "p99_ms": p50,
            "cpu_ms_per_request": {"worker": 0.1}}  # fmt: skip


def test_added_latency_is_reported_at_half_direct_and_at_half_each_gateways_own_ceiling() -> None:
    closed = {"direct": [_load(1000, 5)], "gateway_1": [_load(300, 9)],
              "gateway_2": [_load(700, 6)]}  # fmt: skip
    # At half the direct rate (500/s) one gateway process (300/s) queues: 400 ms "added".
    opened = {"direct": [_load(500, 1.0)], "gateway_1": [_load(290, 401.0)],
              "gateway_2": [_load(500, 1.6)]}  # fmt: skip
    own_half = {
        "gateway_1": {"direct": [_load(150, 1.0)], "gateway_1": [_load(150, 1.4)]},
        "gateway_2": {"direct": [_load(350, 1.0)], "gateway_2": [_load(350, 1.5)]},
    }
    summary = summarize(closed, opened, own_half)
    assert summary["added_p50_ms"] == {"gateway_1": 400.0, "gateway_2": 0.6}
    assert summary["near_saturation_at_half_direct"] == {"gateway_1": True, "gateway_2": False}
    assert summary["added_p50_at_half_own_ceiling_ms"] == {"gateway_1": 0.4, "gateway_2": 0.5}
    assert summary["at_half_own_ceiling"]["gateway_1"]["rate_per_s"] == 150
    assert summary["goals"]["added_p50_1_passed"] is False
    assert summary["goals"]["added_p50_1_at_own_half_passed"] is True


def test_gateway_only_runs_take_length_and_repeats(tmp_path: Path) -> None:
    opts = parse_options([f"--out={tmp_path}", "--gateway-only", "--seconds=2", "--repeats=2"])
    assert opts.gateway_only and opts.seconds == 2 and opts.overhead_rounds == 2
