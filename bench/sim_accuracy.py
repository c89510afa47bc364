"""The simulator against real runs on this machine: the same fleet, the same load, figure by
figure (``error`` = |simulated - measured| / measured).

What is measured comes from ``bench/results/fleet.json`` (``python -m bench.fleet``: one
gateway and three workers with the synthetic model, batches of at most 4 taking 40 ms):

- ``saturation``: 64 closed-loop clients through the gateway (throughput, p50, p99);
- ``worker_killed``: open-loop load at half the 3-worker throughput, one worker SIGKILLed a
  third of the way in (throughput, p50, p99, failed requests).

The simulator runs ``bench/scenarios/fleet-3-workers.yaml`` (its calibration file is this
machine's: the synthetic model's batch time, a hop, a request's overhead) with the same
load. The steady 50%/90%, 2x overload and chat-session cases need real runs of their own
and are not in this file yet.

    python -m bench.sim_accuracy              # bench/results/sim_accuracy.json and .png
    python -m bench.sim_accuracy --smoke --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conveyor.sim.run import simulate
from conveyor.sim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "bench" / "scenarios" / "fleet-3-workers.yaml"
MEASURED = ROOT / "bench" / "results" / "fleet.json"
GOAL = 0.15


def _closed(base: Scenario, clients: int, seconds: float) -> Scenario:
    """The saturation case: ``clients`` sending again as soon as answered."""
    traffic = [{"kind": "closed", "name": "clients", "sessions": clients, "turns": 1_000_000,
                "think_s": 0.0, "prompt_tokens": {"mean": 8}, "timeout_s": 30}]  # fmt: skip
    raw = base.model_dump()
    raw.update(traffic=traffic, faults=[], duration_s=seconds, drain_s=0.0)
    return Scenario.model_validate(raw)


def _figure(measured: float, simulated: float | None) -> dict[str, Any]:
    sim = 0.0 if simulated is None else float(simulated)
    error = abs(sim - measured) / measured if measured else (0.0 if sim == 0 else None)
    return {"measured": measured, "simulated": round(sim, 3),
            "error": None if error is None else round(error, 4),
            "within_goal": error is not None and error <= GOAL}  # fmt: skip


def compare(real: dict[str, Any], seed: int, seconds_scale: float = 1.0) -> dict[str, Any]:
    """Each case's figures, measured against simulated."""
    base = load_scenario(SCENARIO)
    sat = real["runs"]["workers_3"]
    window_s = float(real["inputs"]["seconds"]) * seconds_scale
    run = simulate(_closed(base, int(real["inputs"]["num_clients"]), window_s), seed).totals
    cases: dict[str, Any] = {"saturation": {
        "throughput_rps": _figure(sat["throughput_per_s"], run["throughput_rps"]),
        "p50_ms": _figure(sat["p50_ms"], run["latency_ms"]["p50"]),
        "p99_ms": _figure(sat["p99_ms"], run["latency_ms"]["p99"]),
    }}  # fmt: skip
    fail = real["failover"]
    scenario = base.model_copy(update={"duration_s": base.duration_s * seconds_scale})
    run = simulate(scenario, seed).totals
    cases["worker_killed"] = {
        "throughput_rps": _figure(fail["load"]["throughput_per_s"], run["throughput_rps"]),
        "p50_ms": _figure(fail["load"]["p50_ms"], run["latency_ms"]["p50"]),
        "p99_ms": _figure(fail["load"]["p99_ms"], run["latency_ms"]["p99"]),
        "failed": {"measured": fail["num_failed"], "simulated": run["failed_5xx"] + run["lost"]},
    }
    return cases


def plot(cases: dict[str, Any], path: Path) -> None:
    """Measured and simulated side by side, one bar pair per figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, measured, simulated = [], [], []
    for case, figures in cases.items():
        for name, fig in figures.items():
            if name.endswith(("_ms", "_rps")):
                labels.append(f"{case}\n{name}")
                measured.append(fig["measured"])
                simulated.append(fig["simulated"])
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], measured, 0.4, label="measured (bench/results/fleet.json)")
    ax.bar([x + 0.2 for x in xs], simulated, 0.4, label="simulated")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_title("conveyor simulate against a real 3-worker fleet on this machine")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    """Compare, write the JSON and the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="Short simulated runs.")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    real = json.loads(MEASURED.read_text(encoding="utf-8"))
    cases = compare(real, args.seed, 0.3 if args.smoke else 1.0)
    result = {
        "measured_from": "bench/results/fleet.json", "scenario": SCENARIO.name,
        "goal_error": GOAL, "seed": args.seed, "is_smoke": args.smoke, "cases": cases,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim_accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(cases, args.out / "sim_accuracy.png")
    print(json.dumps(cases, indent=2))


if __name__ == "__main__":
    main()
