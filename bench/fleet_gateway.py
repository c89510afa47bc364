"""The gateway's cost, side by side: one fast worker straight, through a gateway of one
process, and through a gateway of two processes (``--processes 2``), in one run.

Contenders alternate (the order rotates every round), after a quiet-machine wait; each
gets warm-up runs (discarded) and counted runs, reported as medians with their spread:

- closed loop (saturation): requests/s, and each contender's ratio to the direct figure;
  the CPU each process spent per request (gateway and worker), from /proc;
- open loop at half the direct median (the issue's "half load"): p50 and p99, and the
  gateway's added p50 latency. When one gateway process cannot carry half the direct rate
  (a small machine shared with the worker and the load generator), that figure is queueing
  at or near saturation, not the cost of a hop: ``near_saturation_at_half_direct`` says
  so (the offered rate is over ``NEAR_SATURATION`` of that gateway's closed-loop median);
- so, for each gateway, also open loop at half *its own* closed-loop median, with the worker
  straight at that same rate beside it: the added p50 of the hop itself, labelled
  ``added_p50_at_half_own_ceiling_ms``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    CLOCK_TICKS_PER_S,
    ServerProcess,
    http_get,
    process_ticks,
    wait_until_quiet,
)
from bench.loadgen import LoadMode, LoadSpec, run_load_process

# The fast worker: 2 ms batches of up to 100 (ceiling 50,000 inputs/s, far above
# what HTTP allows), so the HTTP stacks, not the model, decide the figures.
FAST_WORKER_MODEL = {
    "name": "syn", "kind": "synthetic", "max_batch_size": 100, "max_wait_ms": 2,
    "max_queue": 8192, "batch_latency_ms": 2, "dim": 4, "max_input_tokens": 64,
}  # fmt: skip
CONTENDERS = ("direct", "gateway_1", "gateway_2")
RATIO_GOAL = 0.6
RATIO_AIM = 0.8
ADDED_P50_GOAL_MS = 1.0
# Offered above this share of a contender's closed-loop ceiling, an open-loop run queues.
NEAR_SATURATION = 0.8


def wait_processes(gateway: ServerProcess, count: int, timeout_s: float = 60) -> list[int]:
    """Block until ``count`` distinct processes answer on the gateway's port; their ids.

    Connections go to processes already listening: load started before all of them are
    up would stay on the first one for the whole run.
    """
    pids: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(pids) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(pids)} of {count} gateway processes answered")
        pids.add(int(json.loads(http_get(gateway.port, "/health")[1])["pid"]))
        time.sleep(0.02)
    return sorted(pids)


def _ticks(pids: list[int]) -> int:
    return sum(process_ticks(pid) or 0 for pid in pids)


def _timed_run(
    spec: LoadSpec, port: int, bodies: Path, cpu_pids: dict[str, list[int]]
) -> dict[str, Any]:
    """One load run, with the CPU each named process set spent per answered request."""
    before = {name: _ticks(pids) for name, pids in cpu_pids.items()}
    result = run_load_process(spec, port, bodies)
    answered = max(1, result.num_ok)
    cpu_ms = {
        name: round((_ticks(pids) - before[name]) / CLOCK_TICKS_PER_S * 1000 / answered, 4)
        for name, pids in cpu_pids.items()
    }
    return {**result.to_dict(), "cpu_ms_per_request": cpu_ms}


def _alternate(
    rounds: int, warmups: int, run_one: Callable[[str], dict[str, Any]], is_smoke: bool,
    names: tuple[str, ...] = CONTENDERS,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """``rounds`` rounds of every contender (rotating order); the first ``warmups`` dropped."""
    counted: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index in range(warmups + rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            quiet = wait_until_quiet(max_wait_s=0.0 if is_smoke else 10.0)
            run = {**run_one(name), "machine_busy": quiet.is_busy}
            if index >= warmups:
                counted[name].append(run)
    return counted


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def _median_p50(runs: list[dict[str, Any]]) -> float:
    return float(statistics.median(r["p50_ms"] or 0.0 for r in runs))


def own_half_summary(
    tput: dict[str, dict[str, float]], own_half: dict[str, dict[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """Per gateway, at half its own ceiling: the rate, both p50s and the added p50."""
    summary: dict[str, Any] = {}
    for name, runs in own_half.items():
        p50 = {"direct": _median_p50(runs["direct"]), name: _median_p50(runs[name])}
        summary[name] = {
            "rate_per_s": round(tput[name]["median"] / 2, 1),
            "p50_ms": {k: round(v, 3) for k, v in p50.items()},
            "added_p50_ms": round(p50[name] - p50["direct"], 3),
        }
    return summary


def summarize(
    closed: dict[str, list[dict[str, Any]]], opened: dict[str, list[dict[str, Any]]],
    own_half: dict[str, dict[str, list[dict[str, Any]]]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Medians and spreads, ratios to direct, added p50 (at half the direct rate, and at
    half each gateway's own ceiling), and the goals."""
    tput = {n: _spread([r["throughput_per_s"] for r in runs]) for n, runs in closed.items()}
    direct = tput["direct"]["median"] or 1.0
    ratio = {n: round(tput[n]["median"] / direct, 3) for n in CONTENDERS}
    p50 = {n: _spread([r["p50_ms"] or 0.0 for r in runs]) for n, runs in opened.items()}
    p99 = {n: _spread([r["p99_ms"] or 0.0 for r in runs]) for n, runs in opened.items()}
    added = {n: round(p50[n]["median"] - p50["direct"]["median"], 3) for n in CONTENDERS[1:]}
    cpu = {
        n: {
            proc: round(statistics.median(r["cpu_ms_per_request"][proc] for r in runs), 4)
            for proc in runs[0]["cpu_ms_per_request"]
        }
        for n, runs in closed.items()
    }
    half_direct = tput["direct"]["median"] / 2
    own = own_half_summary(tput, own_half or {})
    return {
        "throughput_per_s": tput,
        "ratio_to_direct": ratio,
        "half_direct_rate_per_s": round(half_direct, 1),
        "open_loop_p50_ms": p50,
        "open_loop_p99_ms": p99,
        "added_p50_ms": added,
        # Half the direct rate is (nearly) all this gateway carries: its added p50 is queueing.
        "near_saturation_at_half_direct": {
            n: half_direct > NEAR_SATURATION * tput[n]["median"] for n in CONTENDERS[1:]
        },
        "at_half_own_ceiling": own,
        "added_p50_at_half_own_ceiling_ms": {n: v["added_p50_ms"] for n, v in own.items()},
        "cpu_ms_per_request": cpu,
        "goals": {
            "ratio_goal": RATIO_GOAL, "ratio_aim": RATIO_AIM,
            "added_p50_goal_ms": ADDED_P50_GOAL_MS,
            "ratio_1_passed": ratio["gateway_1"] >= RATIO_GOAL,
            "added_p50_1_passed": added["gateway_1"] <= ADDED_P50_GOAL_MS,
            "added_p50_1_at_own_half_passed": (
                own["gateway_1"]["added_p50_ms"] <= ADDED_P50_GOAL_MS
                if "gateway_1" in own else None
            ),
        },
    }  # fmt: skip


def measure_gateway_overhead(
    fleet: Any, wait_routable: Callable[[ServerProcess, set[str]], None], bodies: Path, *,
    seconds: float, num_clients: int, rounds: int, warmups: int, is_smoke: bool,
) -> dict[str, Any]:  # fmt: skip
    """Direct vs 1 and 2 gateway processes on one fast worker (``fleet`` is a ``Fleet``)."""
    # The three start together (nothing is measured before all are ready).
    worker = fleet.add_worker("fast", FAST_WORKER_MODEL, wait=False)
    gateways = {"gateway_1": fleet.add_gateway("gw1", wait=False),
                "gateway_2": fleet.add_gateway("gw2", 2, wait=False)}  # fmt: skip
    for proc in (worker, *gateways.values()):
        proc.wait_ready()
    gateway_pids = {
        "gateway_1": wait_processes(gateways["gateway_1"], 1),
        "gateway_2": wait_processes(gateways["gateway_2"], 2),
    }
    for gateway in gateways.values():
        wait_routable(gateway, {"fast"})
    ports = {"direct": worker.port, **{n: g.port for n, g in gateways.items()}}

    def cpu_pids(name: str) -> dict[str, list[int]]:
        if name == "direct":
            return {"worker": [worker.pid]}
        return {"worker": [worker.pid], "gateway": gateway_pids[name]}

    closed_spec = LoadSpec(
        mode=LoadMode.CLOSED, seconds=seconds, num_clients=num_clients,
        ramp_s=min(1.0, seconds / 3), drain_s=2.0,
    )  # fmt: skip
    closed = _alternate(
        rounds, warmups, lambda n: _timed_run(closed_spec, ports[n], bodies, cpu_pids(n)),
        is_smoke,
    )  # fmt: skip

    def open_runs(rate: float, names: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
        spec = LoadSpec(
            mode=LoadMode.OPEN, seconds=seconds, rate_per_s=max(10.0, rate),
            expected_latency_ms=20, ramp_s=min(1.0, seconds / 3), drain_s=2.0,
        )  # fmt: skip
        return _alternate(
            rounds, warmups, lambda n: run_load_process(spec, ports[n], bodies).to_dict(),
            is_smoke, names,
        )  # fmt: skip

    ceiling = {n: statistics.median(r["throughput_per_s"] for r in closed[n]) for n in closed}
    half_rate = max(10.0, ceiling["direct"] / 2)
    opened = open_runs(half_rate, CONTENDERS)
    own_half = {n: open_runs(ceiling[n] / 2, ("direct", n)) for n in CONTENDERS[1:]}
    return {
        "inputs": {
            "model": FAST_WORKER_MODEL, "seconds": seconds, "num_clients": num_clients,
            "rounds": rounds, "warmups": warmups, "open_loop_rate_per_s": half_rate,
            "gateway_pids": gateway_pids,
        },
        "closed_loop": closed,
        "open_loop": opened,
        "open_loop_at_half_own_ceiling": own_half,
        "summary": summarize(closed, opened, own_half),
    }  # fmt: skip


def gateway_panel(ax: Any, overhead: dict[str, Any]) -> None:
    """Bars: closed-loop requests/s per contender with min-max spread, ratios and p50s."""
    summary = overhead["summary"]
    tput = summary["throughput_per_s"]
    medians = [tput[n]["median"] for n in CONTENDERS]
    low = [tput[n]["median"] - tput[n]["min"] for n in CONTENDERS]
    high = [tput[n]["max"] - tput[n]["median"] for n in CONTENDERS]
    labels = ["direct", "gateway\n1 process", "gateway\n2 processes"]
    ax.bar(labels, medians, yerr=[low, high], capsize=4, color=["tab:gray", "tab:blue", "tab:cyan"])
    for index, name in enumerate(CONTENDERS):
        p50 = summary["open_loop_p50_ms"][name]["median"]
        ratio = summary["ratio_to_direct"][name]
        text = f"x{ratio:.2f}\np50 {p50:.2f} ms"
        if summary.get("near_saturation_at_half_direct", {}).get(name):
            text += " (near saturation)"
        own = summary.get("added_p50_at_half_own_ceiling_ms", {}).get(name)
        if own is not None:
            text += f"\n+{own:.2f} ms at half own"
        ax.annotate(text, (index, medians[index]), ha="center", va="bottom", fontsize=8)
    ax.axhline(medians[0] * RATIO_GOAL, color="tab:red", linestyle="--", label="goal 0.6 x direct")
    ax.set_ylabel("requests/s (closed loop), median and spread")
    ax.set_title(
        "one fast worker: direct vs through the gateway\n(p50 at half the direct rate; "
        "added p50 at half each gateway's own ceiling)", fontsize=9,
    )  # fmt: skip
    ax.legend(fontsize=8)
