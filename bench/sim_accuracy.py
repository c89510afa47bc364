"""The simulator against real runs on this machine: the same fleet, the same load, figure by
figure (``error`` = |simulated - measured| / measured; for the prefix hit ratio, the
absolute difference).

Real runs of its own (``bench.sim_accuracy_real``; one gateway and three workers as
``bench.fleet`` and ``bench.prefix_routing`` start them):

- ``steady_50``, ``steady_90``: open-loop load at 50% and 90% of the synthetic fleet's
  300 inputs/s (throughput, p50, p99);
- ``overload_2x``: twice that capacity, each worker's queue capped at 64 inputs
  (throughput, p50, p99 of what was served, 429 count);
- ``chat``: 12 sessions x 4 turns on a small random Llama behind a prefix-routing gateway
  (prefix-cache hit ratio).

And two cases from ``bench/results/fleet.json`` (``python -m bench.fleet``): ``saturation``
(64 closed-loop clients) and ``worker_killed`` (half load, one worker SIGKILLed).

The simulator runs ``bench/scenarios/fleet-3-workers.yaml`` (one-shot cases; its
calibration is this machine's synthetic-model batch time, a hop and a request's overhead)
and ``bench/scenarios/chat-3-workers.yaml`` with the token counts the real run measured
(the system prompt and a user turn through the gateway's tokenizer; the answer with its
template solved from the workers' prompt-token counter) and a step time from the
workers' engine-step seconds. ``--smoke`` takes the measured figures of the committed
result and simulates shorter runs (seconds, no real fleet); ``--reuse`` simulates in full
against the committed measurements (after a change to the simulator).

    python -m bench.sim_accuracy              # bench/results/sim_accuracy.json and .png
    python -m bench.sim_accuracy --reuse      # the same, against the committed measurements
    python -m bench.sim_accuracy --smoke --out DIR
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.sim_accuracy_plot import plot
from conveyor.sim.run import simulate
from conveyor.sim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "bench" / "scenarios" / "fleet-3-workers.yaml"
CHAT_SCENARIO = ROOT / "bench" / "scenarios" / "chat-3-workers.yaml"
FLEET_RESULT = ROOT / "bench" / "results" / "fleet.json"
RESULT = ROOT / "bench" / "results" / "sim_accuracy.json"
GOAL = 0.15
HIT_RATIO_GOAL = 0.05
ONE_SHOT_SECONDS = 6.0


def _with(base: Scenario, **update: Any) -> Scenario:
    raw = base.model_dump()
    raw.update(update)
    return Scenario.model_validate(raw)


def _figure(measured: float, simulated: float | None) -> dict[str, Any]:
    sim = 0.0 if simulated is None else float(simulated)
    error = abs(sim - measured) / measured if measured else (0.0 if sim == 0 else None)
    return {"measured": measured, "simulated": round(sim, 3),
            "error": None if error is None else round(error, 4),
            "within_goal": error is not None and error <= GOAL}  # fmt: skip


def _latency(real: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    return {"throughput_rps": _figure(real["throughput_per_s"], run["throughput_rps"]),
            "p50_ms": _figure(real["p50_ms"], run["latency_ms"]["p50"]),
            "p99_ms": _figure(real["p99_ms"], run["latency_ms"]["p99"])}  # fmt: skip


def recorded_cases(real: dict[str, Any], seed: int, scale: float) -> dict[str, Any]:
    """``saturation`` and ``worker_killed`` against ``bench/results/fleet.json``."""
    base = load_scenario(SCENARIO)
    traffic = [{"kind": "closed", "name": "clients", "sessions": int(real["inputs"]["num_clients"]),
                "turns": 1_000_000, "think_s": 0.0, "prompt_tokens": {"mean": 8},
                "timeout_s": 30}]  # fmt: skip
    window_s = float(real["inputs"]["seconds"]) * scale
    closed = _with(base, traffic=traffic, faults=[], duration_s=window_s, drain_s=0.0)
    cases = {"saturation": _latency(real["runs"]["workers_3"], simulate(closed, seed).totals)}
    fail = real["failover"]
    run = simulate(_with(base, duration_s=base.duration_s * scale), seed).totals
    cases["worker_killed"] = {**_latency(fail["load"], run), "failed": {
        "measured": fail["num_failed"], "simulated": run["failed_5xx"] + run["lost"]}}  # fmt: skip
    return cases


def one_shot_calibration(measured: dict[str, Any], base: Scenario) -> dict[str, Any]:
    """This machine's batch time in the run: three workers' full batches at the saturated
    rate measured before and after the loads (their mean; the 40 ms sleep plus what the
    worker's own code costs on a shared CPU); hop and request overhead as committed."""
    assert base.fleet is not None
    committed = json.loads((Path(base.base_dir) / str(base.time_model.calibration)).read_text())
    size = base.fleet.batching.max_batch_size
    workers = sum(region.workers for region in base.fleet.regions)
    runs = [measured[k] for k in ("capacity", "capacity_after") if k in measured]
    capacity = sum(float(run["throughput_per_s"]) for run in runs) / len(runs)
    fixed_s = workers * size / capacity
    return {**committed, "one_shot": {"fixed_s": round(fixed_s, 5), "per_item_s": 0.0}}


def one_shot_cases(
    measured: dict[str, Any], seed: int, scale: float, work_dir: Path
) -> dict[str, Any]:
    """The steady and overload cases, each simulated at the rate the real run offered, on
    the batch time its capacity run measured."""
    from bench.sim_accuracy_real import ONE_SHOT_MAX_QUEUE

    base = load_scenario(SCENARIO)
    assert base.fleet is not None
    batching = {**base.fleet.batching.model_dump(), "max_queue": ONE_SHOT_MAX_QUEUE}
    fleet = {**base.fleet.model_dump(), "batching": batching}
    calibration = one_shot_calibration(measured, base)
    (work_dir / "calibration-one-shot.json").write_text(json.dumps(calibration))
    time_model = {"calibration": "calibration-one-shot.json"}
    cases: dict[str, Any] = {"calibration": calibration}
    for case, real in measured.items():
        if case.startswith("capacity"):
            continue
        traffic = [{"kind": "poisson", "name": case, "rate_rps": real["offered_per_s"],
                    "arrivals": "constant", "prompt_tokens": {"mean": 8},
                    "timeout_s": 30}]  # fmt: skip
        scenario = _with(base, fleet=fleet, traffic=traffic, faults=[], time_model=time_model,
                         base_dir=str(work_dir), duration_s=real["window_s"] * scale,
                         drain_s=3.0)  # fmt: skip
        run = simulate(scenario, seed).totals
        cases[case] = _latency(real, run)
        if case.startswith("overload"):
            refused = real["errors_by_status"].get("429", 0) * scale
            cases[case]["rejected_429"] = _figure(refused, run["rejected_429"])
    return cases


def chat_terms(real: dict[str, Any]) -> dict[str, float]:
    """Token counts and step-time terms for the simulated sessions, from the real run.

    The answer's tokens (with the template around it) solve the prompt-token total: turn
    ``k`` of a session sends system + k user turns + (k - 1) answers. The step time is
    the workers' engine-step seconds (their counter) spread over the tokens they
    computed: one term a token, no fixed cost a step.
    """
    sessions, turns = real["sessions"], real["turns"]
    system, user = real["system_tokens"], real["user_tokens"]
    fixed = sessions * (turns * system + user * turns * (turns + 1) / 2)
    answer = (real["prompt_tokens"] - fixed) / (sessions * turns * (turns - 1) / 2)
    computed = (
        real["prompt_tokens"] - real["hit_tokens"] + real["num_requests"] * real["max_tokens"]
    )
    per_token_s = real["engine_step_s"] / computed
    return {"system_tokens": system, "user_tokens": round(user, 2),
            "answer_tokens": round(answer, 2), "per_token_s": per_token_s}  # fmt: skip


def chat_case(real: dict[str, Any], seed: int, work_dir: Path) -> dict[str, Any]:
    """The chat case: the prefix hit ratio, measured against simulated."""
    terms = chat_terms(real)
    calibration = {"llm": {"weights_s": 0.0, "per_kv_token_s": 0.0,
                           "per_token_s": terms["per_token_s"]},
                   "hop_s": 0.0005, "request_overhead_s": 0.001}  # fmt: skip
    (work_dir / "calibration-chat-this-machine.json").write_text(json.dumps(calibration))
    base = load_scenario(CHAT_SCENARIO)
    traffic = [{**base.traffic[0].model_dump(), "sessions": real["sessions"],
                "turns": real["turns"], "shared_prefix_tokens": int(terms["system_tokens"]),
                "prompt_tokens": {"mean": terms["user_tokens"] + terms["system_tokens"],
                                  "dist": "fixed"},
                "output_tokens": {"mean": terms["answer_tokens"], "dist": "fixed"}}]  # fmt: skip
    run = simulate(_with(base, traffic=traffic, base_dir=str(work_dir)), seed).totals
    measured, simulated = real["prefix_cache_hit_rate"], run["prefix_hit_ratio"] or 0.0
    return {"prefix_hit_ratio": {
        "measured": measured, "simulated": simulated, "error": round(abs(simulated - measured), 4),
        "within_goal": abs(simulated - measured) <= HIT_RATIO_GOAL}, "terms": terms}  # fmt: skip


def measure(out: Path) -> dict[str, Any]:
    """The real runs (about a minute and a half on this machine)."""
    from bench.sim_accuracy_real import measure_chat, measure_one_shot

    with tempfile.TemporaryDirectory() as work:
        one_shot = measure_one_shot(Path(work), ONE_SHOT_SECONDS)
    with tempfile.TemporaryDirectory() as work:
        chat = measure_chat(Path(work))
    return {"one_shot": one_shot, "chat": chat}


def main() -> None:
    """Measure (or reuse the committed measurements with --smoke), simulate, write."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="Committed measurements, short runs.")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reuse", action="store_true",
                        help="Simulate against the committed result's measurements.")  # fmt: skip
    args = parser.parse_args()
    scale = 0.3 if args.smoke else 1.0
    reuse = args.smoke or args.reuse
    measured = json.loads(RESULT.read_text())["measured"] if reuse else measure(args.out)
    cases = recorded_cases(json.loads(FLEET_RESULT.read_text()), args.seed, scale)
    with tempfile.TemporaryDirectory() as work:
        cases.update(one_shot_cases(measured["one_shot"], args.seed, scale, Path(work)))
        cases["chat"] = chat_case(measured["chat"], args.seed, Path(work))
    calibration = {"one_shot": cases.pop("calibration"), "chat": cases["chat"].pop("terms")}
    result = {
        "measured_from": ["bench/results/fleet.json", "this run (bench/sim_accuracy_real.py)"],
        "scenarios": [SCENARIO.name, CHAT_SCENARIO.name], "goal_error": GOAL,
        "goal_hit_ratio": HIT_RATIO_GOAL, "seed": args.seed, "is_smoke": args.smoke,
        "cases": cases, "calibration": calibration, "measured": measured,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim_accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(cases, args.out / "sim_accuracy.png")
    print(json.dumps(cases, indent=2))


if __name__ == "__main__":
    main()
