"""What tenant rate limits cost: throughput with limits on (Redis buckets) vs off, same run.

Two contenders of each kind run side by side on this machine, alternating round by round
(the order rotates), after a quiet-machine wait:

- ``serve``: two ``conveyor serve`` processes on the fast synthetic model, one without
  tenant limits, one whose every request passes the limiter (``default_tenant_limits`` far
  above the load, so nothing is refused) with its buckets in Redis;
- ``gateway``: two gateways (off, on as above) in front of one fast worker on PostgreSQL.

Closed-loop requests/s per contender (median of the counted rounds); the cost is the
median over rounds of ``1 - on / off`` (each round runs both back to back), against the
issue's goal of at most 10 %; every round's cost is recorded as its spread. The server
process's CPU per answered request is recorded too (``cpu_cost = on / off - 1``), and so
are the Redis script calls per answered request: with local shares a busy process calls
Redis a few times a second, not once a request (Redis serves nothing else during a
quiet-machine run).

Needs PostgreSQL (as ``bench.fleet``) and Redis on 127.0.0.1:6379.

    python -m bench.tenant_limits            # bench/results/tenant_limits.json and .png
    python -m bench.tenant_limits --smoke --out DIR
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis
import yaml

from bench.common import (
    CLOCK_TICKS_PER_S,
    RESULTS_DIR,
    ServerProcess,
    machine_info,
    package_versions,
    process_ticks,
    python_argv,
    save_figure,
    wait_until_quiet,
    write_results,
)
from bench.fleet import Fleet, fresh_database, wait_routable, write_bodies
from bench.fleet_gateway import FAST_WORKER_MODEL
from bench.loadgen import LoadMode, LoadSpec, run_load_process

REDIS_URL = "redis://127.0.0.1:6379/0"
COST_GOAL = 0.10
# Far above any load here: every request is admitted, but each one pays for the buckets.
UNREACHED_LIMITS = {"rpm": 10**9, "input_tpm": 10**12, "output_tpm": 10**12}
MODES = ("off", "on")


@dataclass(frozen=True, slots=True)
class Options:
    """Run lengths and load shape."""

    out_dir: Path
    is_smoke: bool
    seconds: float
    num_clients: int
    rounds: int
    warmups: int


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Command-line options; ``--smoke`` shortens every run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run (seconds) for tests")
    parser.add_argument("--seconds", type=float, help="seconds a run lasts (default 2)")
    parser.add_argument("--clients", type=int, help="closed-loop clients (default 64)")
    parser.add_argument("--rounds", type=int, help="counted rounds of each mode (default 21)")
    parser.add_argument("--warmups", type=int, help="rounds run first and dropped (default 1)")
    args = parser.parse_args(argv)
    if args.smoke:
        opts = Options(args.out, True, seconds=1.0, num_clients=8, rounds=1, warmups=0)
    else:
        opts = Options(args.out, False, seconds=2.0, num_clients=64, rounds=21, warmups=1)
    given = {"seconds": args.seconds, "num_clients": args.clients, "rounds": args.rounds,
             "warmups": args.warmups}  # fmt: skip
    return replace(opts, **{k: v for k, v in given.items() if v is not None})


def limits_config(mode: str, prefix: str) -> dict[str, Any]:
    """The tenant settings of a contender: none (off), or unreached limits in Redis (on)."""
    if mode == "off":
        return {}
    return {
        "default_tenant_limits": UNREACHED_LIMITS,
        "rate_limits": {"backend": "redis", "redis_url": REDIS_URL, "redis_prefix": prefix},
    }


def start(stack: ExitStack, name: str, argv: Any, work_dir: Path) -> ServerProcess:
    """A started, ready server process, stopped when `stack` closes."""
    proc = stack.enter_context(ServerProcess(name, argv, log_path=work_dir / f"{name}.log"))
    proc.start()
    proc.wait_ready()
    return proc


def start_serves(stack: ExitStack, work_dir: Path, prefix: str) -> dict[str, ServerProcess]:
    """`conveyor serve` with limits off and on."""
    procs = {}
    for mode in MODES:
        config = {"data_dir": str(work_dir / f"serve-{mode}"), "log_level": "warning",
                  "models": [FAST_WORKER_MODEL], **limits_config(mode, prefix)}  # fmt: skip
        path = work_dir / f"serve-{mode}.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = lambda port, p=path: python_argv(  # noqa: E731
            "-m", "conveyor", "serve", "--config", str(p), "--port", str(port)
        )
        procs[mode] = start(stack, f"serve-{mode}", argv, work_dir)
    return procs


def start_gateways(
    stack: ExitStack, work_dir: Path, prefix: str, store_url: str
) -> dict[str, ServerProcess]:
    """One fast worker, and gateways in front of it with limits off and on."""
    Fleet(store_url, work_dir, stack).add_worker("fast", FAST_WORKER_MODEL)
    procs = {}
    for mode in MODES:
        path = work_dir / f"gateway-{mode}.yaml"
        path.write_text(yaml.safe_dump({"log_level": "warning", **limits_config(mode, prefix)}))
        argv = lambda port, p=path: python_argv(  # noqa: E731
            "-m", "conveyor", "gateway", "--config", str(p), "--store", store_url,
            "--port", str(port), "--stale-after-s", "1.0", "--refresh-s", "0.1",
        )  # fmt: skip
        procs[mode] = start(stack, f"gateway-{mode}", argv, work_dir)
        wait_routable(procs[mode], {"fast"})
    return procs


def alternate(opts: Options, procs: dict[str, ServerProcess], bodies: Path) -> dict[str, Any]:
    """Closed-loop runs of off and on, rotating, warm-ups dropped; medians and the cost."""
    spec = LoadSpec(mode=LoadMode.CLOSED, seconds=opts.seconds, num_clients=opts.num_clients,
                    ramp_s=min(1.0, opts.seconds / 3), drain_s=2.0)  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for index in range(opts.warmups + opts.rounds):
        order = MODES if index % 2 == 0 else MODES[::-1]
        for mode in order:
            quiet = wait_until_quiet(max_wait_s=0.5 if opts.is_smoke else 10.0)
            run = {**timed_run(spec, procs[mode], bodies), "machine_busy": quiet.is_busy}
            if index >= opts.warmups:
                runs[mode].append(run)
    return {"runs": runs, "summary": summarize(runs)}


def redis_script_calls() -> int:
    """Lua script calls Redis has served since it started (EVAL and EVALSHA)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    calls = (stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("eval", "evalsha"))
    return sum(int(n) for n in calls)


def timed_run(spec: LoadSpec, proc: ServerProcess, bodies: Path) -> dict[str, Any]:
    """One load run, with the CPU the server process spent per answered request and the
    Redis script calls per answered request (the limiter's round trips; 0 with limits off).

    On a machine shared with other work, CPU per request holds steadier than requests/s.
    """
    before, calls_before = process_ticks(proc.pid) or 0, redis_script_calls()
    result = run_load_process(spec, proc.port, bodies)
    spent_s = ((process_ticks(proc.pid) or 0) - before) / CLOCK_TICKS_PER_S
    num_ok = max(1, result.num_ok)
    return {**result.to_dict(),
            "server_cpu_us_per_request": round(spent_s * 1e6 / num_ok, 1),
            "redis_script_calls_per_request": round(
                (redis_script_calls() - calls_before) / num_ok, 4)}  # fmt: skip


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians of each mode (requests/s, server CPU per request), errors, and the cost of
    limits against the goal.

    The cost is the median over rounds of each round's own cost (`1 - on / off`, the two
    runs of a round back to back), so a machine that speeds up or slows down between rounds
    moves both sides of a pair alike; its spread is every round's cost. The cost of the
    medians is kept beside it; the cost in server CPU per request is a median of pairs too.
    """
    tput = {m: round(statistics.median(r["throughput_per_s"] for r in runs[m]), 1) for m in MODES}
    pair_costs = [round(1 - on["throughput_per_s"] / off["throughput_per_s"], 4)
                  for off, on in zip(runs["off"], runs["on"], strict=True)
                  if off["throughput_per_s"]]  # fmt: skip
    cost = round(statistics.median(pair_costs), 4) if pair_costs else 0.0
    cpu = {m: round(statistics.median(r["server_cpu_us_per_request"] for r in runs[m]), 1)
           for m in MODES}  # fmt: skip
    cpu_costs = [on["server_cpu_us_per_request"] / off["server_cpu_us_per_request"] - 1
                 for off, on in zip(runs["off"], runs["on"], strict=True)
                 if off["server_cpu_us_per_request"]]  # fmt: skip
    cpu_cost = round(statistics.median(cpu_costs), 4) if cpu_costs else 0.0
    calls = {m: statistics.median(r["redis_script_calls_per_request"] for r in runs[m])
             for m in MODES}  # fmt: skip
    errors = {m: sum(r["num_errors"] for r in runs[m]) for m in MODES}
    return {"throughput_per_s": tput, "cost": cost, "round_costs": pair_costs,
            "cost_of_medians": round(1 - tput["on"] / tput["off"], 4) if tput["off"] else 0.0,
            "num_errors": errors, "server_cpu_us_per_request": cpu, "cpu_cost": cpu_cost,
            "redis_script_calls_per_request": calls,
            "cost_goal": COST_GOAL, "cost_passed": cost <= COST_GOAL}  # fmt: skip


def run_benchmark(opts: Options) -> dict[str, Any]:
    """Both comparisons in one work folder, one fresh database and one Redis prefix."""
    work_dir = opts.out_dir / "tenant-limits-work"
    work_dir.mkdir(parents=True, exist_ok=True)
    bodies = write_bodies(work_dir / "bodies.json")
    prefix = f"conveyor-bench:{secrets.token_hex(4)}:"
    with ExitStack() as stack:
        serve = alternate(opts, start_serves(stack, work_dir, prefix), bodies)
    with fresh_database() as store_url, ExitStack() as stack:
        gateway = alternate(opts, start_gateways(stack, work_dir, prefix, store_url), bodies)
    return {
        "inputs": {"is_smoke": opts.is_smoke, "seconds": opts.seconds,
                   "num_clients": opts.num_clients, "rounds": opts.rounds,
                   "warmups": opts.warmups, "model": FAST_WORKER_MODEL,
                   "limits_on": limits_config("on", "<prefix>")},
        "machine": machine_info(),
        "versions": package_versions(),
        "serve": serve,
        "gateway": gateway,
    }  # fmt: skip


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Bars, limits off and on, for serve and the gateway: requests/s and CPU per request."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = (("throughput_per_s", "requests/s (closed loop)", "cost"),
              ("server_cpu_us_per_request", "server CPU µs per request", "cpu_cost"))  # fmt: skip
    for ax, (key, label, cost_key) in zip(axes, panels, strict=True):
        for offset, mode in ((-0.2, "off"), (0.2, "on")):
            values = [result[kind]["summary"][key][mode] for kind in ("serve", "gateway")]
            ax.bar([i + offset for i in range(2)], values, width=0.4, label=f"limits {mode}")
        costs = [result[kind]["summary"][cost_key] for kind in ("serve", "gateway")]
        ax.set_xticks(range(2), [f"serve ({costs[0]:+.0%})", f"gateway ({costs[1]:+.0%})"])
        ax.set_ylabel(label)
        ax.legend()
    save_figure(fig, path, "tenant limits on (Redis buckets) vs off, same run")


def main(argv: Sequence[str] | None = None) -> None:
    """Run, write tenant_limits.json and .png, print both summaries."""
    opts = parse_options(argv)
    result = run_benchmark(opts)
    write_results(opts.out_dir, "tenant_limits", result, write_png)
    print(json.dumps({k: result[k]["summary"] for k in ("serve", "gateway")}, indent=2))


if __name__ == "__main__":
    main()
