"""The counted worker model against the exact one: small scenarios run both ways."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.sim.counted_worker import check_counted
from conveyor.sim.run import simulate
from conveyor.sim.scenario import Scenario
from conveyor.sim.traffic import Prompts

# The counted model's contract: these equal, the rest within this fraction.
EXACT = ("requests", "completed", "lost", "duplicated", "rejected_429", "failed_5xx")
TOLERANCE = 0.05


def scenario(
    model: str, faults: list[dict[str, Any]], kv_tokens: int, rate_rps: float = 40, **engine: Any
) -> Scenario:
    """Three H100 workers, prompts and answers of spread lengths, chunked prefills."""
    return Scenario.model_validate({
        "name": "counted", "duration_s": 8.0, "time_model": {"gpu": "h100"},
        "fleet": {"regions": [{"name": "a", "workers": 3}],
                  "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 512,
                             "max_model_len": 1024, "kv_tokens": kv_tokens,
                             "decode_model": model, **engine}},
        "traffic": [{"kind": "poisson", "rate_rps": rate_rps, "timeout_s": 4,
                     "prompt_tokens": {"mean": 300, "dist": "exponential", "max": 600},
                     "output_tokens": {"mean": 150, "dist": "exponential", "max": 400}}],
        "faults": faults,
    })  # fmt: skip


CASES = {
    "steady": ([], 65536),
    "killed": ([{"kind": "kill_worker", "at_s": 3.0, "worker": "w1"}], 65536),
    "straggler": ([{"kind": "straggler", "at_s": 1.0, "until_s": 4.0, "worker": "w0"}], 65536),
    # A pool of 4,096 tokens a worker: sequences are preempted and recomputed.
    "kv_exhausted": ([], 4096),
    # Three times what the fleet serves: 429s on arrival, late requests shed, callers
    # leaving at their deadline (aborts).
    "overloaded": ([], 8192, 120, {"max_queue": 16}),
}


def _close(counted: float, exact: float) -> bool:
    return abs(counted - exact) <= TOLERANCE * abs(exact)


@pytest.mark.parametrize("case", CASES)
def test_counted_matches_exact_within_the_tolerance(case: str) -> None:
    faults, kv_tokens, *more = CASES[case]
    rate_rps, engine = more if more else (40, {})
    exact = simulate(scenario("exact", faults, kv_tokens, rate_rps, **engine), 3).totals
    counted = simulate(scenario("counted", faults, kv_tokens, rate_rps, **engine), 3).totals
    assert exact["completed"] > 250
    assert {k: counted[k] for k in EXACT} == {k: exact[k] for k in EXACT}
    assert counted["lost"] == counted["duplicated"] == 0
    assert _close(counted["throughput_rps"], exact["throughput_rps"])
    for figure in ("latency_ms", "ttft_ms", "tpot_ms"):
        for quantile in ("p50", "p99"):
            assert _close(counted[figure][quantile], exact[figure][quantile]), (figure, quantile)
    assert _close(counted["preemptions"], exact["preemptions"])
    if case == "kv_exhausted":
        assert exact["preemptions"] > 100
    if case == "overloaded":
        assert exact["rejected_429"] > 100 and exact["failed_5xx"] > 0


def test_counted_requests_carry_their_prompt_length_not_its_ids() -> None:
    spec = scenario("counted", [], 65536).traffic[0]
    with_ids = Prompts(random.Random(5), use_affinity=False).request(spec, 0.0)
    lengths = Prompts(random.Random(5), use_affinity=False, lengths_only=True).request(spec, 0.0)
    assert lengths.prompt_ids == [] and with_ids.prompt_ids
    assert lengths.num_prompt_tokens == with_ids.num_prompt_tokens
    assert lengths.output_tokens == with_ids.output_tokens  # the same draws


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"engine": {"job_tokens_beside_online": 256}}, "batch jobs"),
        ({"affinity": {"use_prefix": True}}, "prefix-aware routing"),
        ({"engine": {"max_num_seqs": 600}}, "max_num_seqs"),
        ({"shared_prefix_tokens": 100}, "shared prompt prefixes"),
    ],
)
def test_what_the_counted_model_does_not_model_is_refused(
    change: dict[str, Any], refusal: str
) -> None:
    raw = scenario("counted", [], 65536).model_dump()
    if "engine" in change:
        raw["fleet"]["engine"].update(change["engine"])
    if "affinity" in change:
        raw["fleet"]["affinity"] = change["affinity"]
    if "shared_prefix_tokens" in change:
        raw["traffic"][0]["shared_prefix_tokens"] = change["shared_prefix_tokens"]
    with pytest.raises(ValueError, match=refusal):
        check_counted(Scenario.model_validate(raw))
    raw["fleet"]["engine"]["decode_model"] = "exact"
    check_counted(Scenario.model_validate(raw))  # the exact model runs it


def test_the_cli_runs_a_scenario_with_the_counted_model(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario("exact", [], 65536).model_dump()), encoding="utf-8")
    runs = {}
    conveyor_logs = logging.getLogger("conveyor")
    level = conveyor_logs.level
    for model in ("exact", "counted"):
        done = CliRunner().invoke(app, ["simulate", str(path), "--json", "--duration-s", "2",
                                        "--decode-model", model])  # fmt: skip
        assert done.exit_code == 0, done.output
        runs[model] = json.loads(done.output)
    # Quiet while the fleet ran, then as before (it was left at ERROR for later tests).
    assert conveyor_logs.level == level
    assert runs["counted"]["decode_model"] == "counted"
    assert runs["counted"]["completed"] == runs["exact"]["completed"] > 0
    refused = CliRunner().invoke(app, ["simulate", str(path), "--decode-model", "guessed"])
    assert refused.exit_code == 2
