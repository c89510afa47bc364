"""Concurrent users as the load: Little's law over a user's cycle, with its derivation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.plan.users import Users, plan_for_users
from tests.unit.plan.test_parallel import LLAMA3_70B


def test_a_fixed_response_time_gives_users_over_the_cycle() -> None:
    plan = plan_for_users(Users(2000, 30.0), lambda qps: {"predicted_mean_ms": 2000.0})
    assert plan["users"]["qps"] == 62.5  # 2,000 / (30 s + 2 s)
    assert plan["users"]["derivation"] == (
        "Little's law over a user's cycle: rate = users / (think time + response time) = "
        "2,000 / (30.000 s + 2.000 s) = 2,000 / 32.000 s = 62.50 requests/s"
    )


def test_a_response_time_that_grows_with_load_settles_at_the_fixed_point() -> None:
    def plan_at(qps: float) -> dict[str, Any]:
        return {"predicted_mean_ms": 1000 * (1 + qps / 100), "qps_asked": qps}

    plan = plan_for_users(Users(1000, 9.0), plan_at)
    qps = plan["users"]["qps"]
    assert qps == pytest.approx(1000 / (9 + 1 + qps / 100), rel=1e-3)
    assert plan["qps_asked"] == pytest.approx(qps, rel=1e-3)  # the plan is made at that rate


def test_a_population_needs_users_and_a_think_time() -> None:
    with pytest.raises(ValueError):
        Users(0, 10.0)
    with pytest.raises(ValueError):
        Users(10, 0.0)


def test_plan_sizes_2000_users_and_prints_the_derivation() -> None:
    args = ["plan", "--model", str(LLAMA3_70B), "--gpu", "h200", "--users", "2000",
            "--think-time-s", "30", "--prompt-tokens", "512", "--output-tokens", "256"]  # fmt: skip
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert text.stdout.startswith("Little's law over a user's cycle: rate = users / (think ")
    plan = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    users = plan["users"]
    assert users["qps"] == pytest.approx(2000 / (30 + users["response_ms"] / 1000), rel=1e-3)
    assert users["response_ms"] == pytest.approx(plan["predicted_mean_ms"], rel=1e-3)
    both = CliRunner().invoke(app, [*args, "--qps", "3"])
    assert both.exit_code == 2 and "not both" in both.stderr
    half = CliRunner().invoke(app, ["plan", "--users", "5", "--prompt-tokens", "8"])
    assert half.exit_code == 2 and "go together" in half.stderr
