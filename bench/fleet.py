"""Fleet benchmark: throughput behind one gateway with 1, 2 and 3 workers, failover, and the
gateway's own cost (direct vs 1 and 2 gateway processes, see ``bench.fleet_gateway``).

With the synthetic model (a calibrated sleep, so workers do not compete for CPU) it measures:

- closed-loop throughput through one gateway with 1, 2 and 3 workers, and the gateway's own
  ceiling (3 workers whose model takes no time), all in the same run;
- failover: open-loop load at half the 3-worker throughput, one worker SIGKILLed a third of
  the way in: the time until the gateway's routing table no longer lists it (after which all
  traffic flows on the survivors) and the requests that failed meanwhile;
- one fast worker straight and through gateways of 1 and 2 processes, alternating, with
  warm-ups and counted runs (medians and spread): throughput ratios, CPU per request, and
  the p50 latency the gateway adds at half load.

Needs PostgreSQL (CONVEYOR_TEST_PG_URL, default the local server's ``test`` database); a
fresh database is created for the run and dropped after it.

A smoke run checks the machinery, not the figures: load runs of half a second, one
fast worker for the gateway's ceiling, one gateway-cost round and no warm-up, and the
failover on the scaling run's 3 slow workers.

    python -m bench.fleet            # full run: bench/results/fleet.json and fleet.png
    python -m bench.fleet --smoke --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from bench.common import (
    RESULTS_DIR,
    ServerProcess,
    http_get,
    machine_info,
    package_versions,
    python_argv,
    write_json,
)
from bench.fleet_gateway import gateway_panel, measure_gateway_overhead
from bench.loadgen import LoadMode, LoadResult, LoadSpec, run_load_process

PG_ADMIN_URL = os.environ.get("CONVEYOR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
MODEL = "syn"
# Each worker serves at most max_batch_size / batch_latency = 4 / 40 ms = 100 inputs/s, far
# below what one gateway forwards, so adding workers is what adds throughput.
SLOW_MODEL = {
    "name": MODEL, "kind": "synthetic", "max_batch_size": 4, "max_wait_ms": 2,
    "max_queue": 4096, "batch_latency_ms": 40, "dim": 4, "max_input_tokens": 64,
}  # fmt: skip
FAST_MODEL = {**SLOW_MODEL, "max_batch_size": 256, "batch_latency_ms": 0}
SPEEDUP_GOAL_AT_2 = 1.8
POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Options:
    """Run lengths and load shape."""

    out_dir: Path
    is_smoke: bool
    seconds: float
    num_clients: int
    failover_seconds: float
    overhead_rounds: int = 3
    overhead_warmups: int = 1
    gateway_only: bool = False
    ceiling_workers: int = 3  # fast workers behind the gateway for its ceiling


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Command-line options; ``--smoke`` shortens every run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run (seconds) for tests")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each run")
    parser.add_argument("--clients", type=int, default=64, help="closed-loop connections")
    parser.add_argument("--repeats", type=int, default=3, help="counted gateway-cost rounds")
    parser.add_argument(
        "--gateway-only", action="store_true",
        help="only the gateway's cost (direct vs 1 and 2 gateway processes)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        return Options(
            args.out, True, seconds=0.5, num_clients=16, failover_seconds=2.0,
            overhead_rounds=1, overhead_warmups=0, gateway_only=args.gateway_only,
            ceiling_workers=1,
        )  # fmt: skip
    return Options(
        args.out, False, seconds=args.seconds, num_clients=args.clients,
        failover_seconds=max(3.0, 1.8 * args.seconds), overhead_rounds=args.repeats,
        gateway_only=args.gateway_only,
    )  # fmt: skip


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new PostgreSQL database for this run, dropped afterwards."""
    import psycopg

    from conveyor.stores import open_job_store

    name = f"conveyor_bench_{uuid.uuid4().hex}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(PG_ADMIN_URL)._replace(path=f"/{name}"))
    try:
        open_job_store(url).close()  # migrate once, before processes race to do it
        yield url
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Fleet:
    """Workers and one gateway on a store, each a ``ServerProcess``; all stopped on exit."""

    def __init__(self, store_url: str, work_dir: Path, stack: ExitStack) -> None:
        self.store_url = store_url
        self.work_dir = work_dir
        self._stack = stack
        self.workers: dict[str, ServerProcess] = {}

    def add_worker(self, name: str, model: dict[str, Any], *, wait: bool = True) -> ServerProcess:
        """Start a worker serving ``model``; with ``wait``, return once it is ready."""
        config = self.work_dir / f"{name}.yaml"
        config.write_text(yaml.safe_dump({"models": [model], "log_level": "warning"}))
        argv = lambda port: python_argv(  # noqa: E731
            "-m", "conveyor", "worker", "--config", str(config), "--store", self.store_url,
            "--listen", f"127.0.0.1:{port}", "--worker-id", name, "--heartbeat-s", "0.2",
        )  # fmt: skip
        proc = self._stack.enter_context(
            ServerProcess(name, argv, log_path=self.work_dir / f"{name}.log")
        )
        proc.start()
        if wait:
            proc.wait_ready()
        self.workers[name] = proc
        return proc

    def add_workers(self, names: Sequence[str], model: dict[str, Any]) -> None:
        """Start the workers together (they load in parallel), then wait for each."""
        for name in names:
            self.add_worker(name, model, wait=False)
        for name in names:
            self.workers[name].wait_ready()

    def add_gateway(
        self, name: str = "gateway", num_processes: int = 1, *, wait: bool = True
    ) -> ServerProcess:
        """Start a gateway of ``num_processes``; with ``wait``, return once it is ready."""
        config = self.work_dir / "gateway.yaml"
        config.write_text(yaml.safe_dump({"log_level": "warning"}))
        argv = lambda port: python_argv(  # noqa: E731
            "-m", "conveyor", "gateway", "--config", str(config), "--store", self.store_url,
            "--port", str(port), "--stale-after-s", "1.0", "--refresh-s", "0.1",
            "--processes", str(num_processes),
        )  # fmt: skip
        proc = self._stack.enter_context(
            ServerProcess(name, argv, log_path=self.work_dir / f"{name}.log")
        )
        proc.start()
        if wait:
            proc.wait_ready()
        return proc


def routable(gateway: ServerProcess) -> set[str]:
    """Worker ids the gateway routes to now."""
    _, body = http_get(gateway.port, "/v1/fleet")
    return {w["id"] for w in json.loads(body)["workers"] if w["is_routable"]}


def wait_routable(gateway: ServerProcess, wanted: set[str], timeout_s: float = 30) -> None:
    """Block until the gateway routes to exactly ``wanted``."""
    deadline = time.monotonic() + timeout_s
    while routable(gateway) != wanted:
        if time.monotonic() > deadline:
            raise RuntimeError(f"gateway never routed to exactly {sorted(wanted)}")
        time.sleep(POLL_S)


def write_bodies(path: Path, count: int = 256) -> Path:
    """Request bodies for the load generator: one short input each."""
    bodies = [json.dumps({"model": MODEL, "input": [f"sentence number {i}"]}) for i in range(count)]
    path.write_text(json.dumps(bodies))
    return path


def closed_loop(opts: Options, gateway: ServerProcess, bodies: Path) -> LoadResult:
    """Saturation throughput through the gateway."""
    spec = LoadSpec(
        mode=LoadMode.CLOSED, seconds=opts.seconds, num_clients=opts.num_clients,
        ramp_s=min(1.0, opts.seconds / 3), drain_s=2.0,
    )  # fmt: skip
    return run_load_process(spec, gateway.port, bodies)


def measure_scaling(
    opts: Options, store_url: str, work_dir: Path, bodies: Path
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Throughput with 1, 2, 3 slow workers, then the gateway ceiling with 3 fast ones (1 in
    a smoke run).

    A smoke run also fails over on the 3 slow workers (a full run starts a fresh fleet
    for it): (the runs, that failover or None).
    """
    runs: dict[str, Any] = {}
    failover = None
    with ExitStack() as stack:
        fleet = Fleet(store_url, work_dir, stack)
        gateway = fleet.add_gateway(wait=False)  # it starts while the first worker does
        for count in (1, 2, 3):
            fleet.add_worker(f"w{count}", SLOW_MODEL)
            gateway.wait_ready()
            wait_routable(gateway, {f"w{i}" for i in range(1, count + 1)})
            runs[f"workers_{count}"] = closed_loop(opts, gateway, bodies).to_dict()
        if opts.is_smoke:
            failover = fail_over(opts, fleet, gateway, bodies, failover_rate(runs))
    with ExitStack() as stack:
        fleet = Fleet(store_url, work_dir, stack)
        gateway = fleet.add_gateway(wait=False)
        fast = [f"f{i}" for i in range(1, opts.ceiling_workers + 1)]
        fleet.add_workers(fast, FAST_MODEL)
        gateway.wait_ready()
        wait_routable(gateway, set(fast))
        runs["gateway_ceiling"] = closed_loop(opts, gateway, bodies).to_dict()
    return runs, failover


def failover_rate(runs: dict[str, Any]) -> float:
    """The failover's open-loop rate: half the 3-worker throughput, 10/s at least."""
    return max(10.0, float(runs["workers_3"]["throughput_per_s"]) / 2)


def measure_failover(
    opts: Options, store_url: str, work_dir: Path, bodies: Path, rate_per_s: float
) -> dict[str, Any]:
    """``fail_over`` on a fresh gateway and 3 slow workers."""
    with ExitStack() as stack:
        fleet = Fleet(store_url, work_dir, stack)
        gateway = fleet.add_gateway(wait=False)
        fleet.add_workers(("k1", "k2", "k3"), SLOW_MODEL)
        gateway.wait_ready()
        wait_routable(gateway, {"k1", "k2", "k3"})
        return fail_over(opts, fleet, gateway, bodies, rate_per_s)


def fail_over(
    opts: Options, fleet: Fleet, gateway: ServerProcess, bodies: Path, rate_per_s: float
) -> dict[str, Any]:
    """Open-loop load on the fleet's workers; SIGKILL the first; time until the gateway
    stops routing to it."""
    victim, *survivors = fleet.workers
    spec = LoadSpec(
        mode=LoadMode.OPEN, seconds=opts.failover_seconds, rate_per_s=rate_per_s,
        expected_latency_ms=60, drain_s=3.0,
    )  # fmt: skip
    result: dict[str, LoadResult] = {}
    loader = threading.Thread(
        target=lambda: result.update(load=run_load_process(spec, gateway.port, bodies))
    )
    loader.start()
    time.sleep(opts.failover_seconds / 3)
    os.kill(fleet.workers[victim].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_routable(gateway, set(survivors))
    removed_s = time.monotonic() - killed_at
    loader.join()
    load = result["load"]
    return {
        "offered_per_s": rate_per_s,
        "time_to_reroute_s": round(removed_s, 3),
        "num_failed": load.num_errors + load.num_unfinished,
        "num_sent": load.num_sent,
        "load": load.to_dict(),
    }


def measure_overhead(opts: Options, store_url: str, work_dir: Path, bodies: Path) -> dict[str, Any]:
    """The gateway's own cost: one fast worker direct vs through 1 and 2 gateway processes."""
    with ExitStack() as stack:
        return measure_gateway_overhead(
            Fleet(store_url, work_dir, stack), wait_routable, bodies, seconds=opts.seconds,
            num_clients=opts.num_clients, rounds=opts.overhead_rounds,
            warmups=opts.overhead_warmups, is_smoke=opts.is_smoke,
        )  # fmt: skip


def evaluate(runs: dict[str, Any]) -> dict[str, Any]:
    """Speedups and whether the 2-worker goal is met (capped by the gateway ceiling)."""
    tput = {k: float(v["throughput_per_s"]) for k, v in runs.items()}
    one = tput["workers_1"]
    ceiling_ratio = tput["gateway_ceiling"] / one if one else 0.0
    target = min(SPEEDUP_GOAL_AT_2, ceiling_ratio)
    speedup_2 = tput["workers_2"] / one if one else 0.0
    return {
        "throughput_per_s": tput,
        "speedup_2": round(speedup_2, 3),
        "speedup_3": round(tput["workers_3"] / one, 3) if one else 0.0,
        "speedup_2_target": round(target, 3),
        "speedup_2_passed": speedup_2 >= target,
    }


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Bars: throughput with 1-3 workers against ideal scaling and the gateway ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tput = result["summary"]["throughput_per_s"]
    counts = [1, 2, 3]
    values = [tput[f"workers_{n}"] for n in counts]
    fig, (ax, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    gateway_panel(right, result["gateway_overhead"])
    ax.bar([str(n) for n in counts], values, color="tab:blue", label="measured")
    ax.plot([str(n) for n in counts], [values[0] * n for n in counts], "k--", label="linear")
    ax.axhline(tput["gateway_ceiling"], color="tab:red", label="gateway ceiling")
    failover = result["failover"]
    ax.set_title(
        f"synthetic model behind one gateway; SIGKILL: rerouted in "
        f"{failover['time_to_reroute_s']} s, {failover['num_failed']} failed",
        fontsize=9,
    )
    ax.set_xlabel("workers")
    ax.set_ylabel("requests/s (closed loop)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_gateway_png(path: Path, result: dict[str, Any]) -> None:
    """The gateway-cost panel alone (``--gateway-only``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    gateway_panel(ax, result["gateway_overhead"])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_benchmark(opts: Options) -> dict[str, Any]:
    """Every measurement, in one fresh database and one work folder."""
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = opts.out_dir / "fleet-work"
    work_dir.mkdir(exist_ok=True)
    bodies = write_bodies(work_dir / "bodies.json")
    if opts.gateway_only:
        with fresh_database() as store_url:
            overhead = measure_overhead(opts, store_url, work_dir, bodies)
        return {"inputs": {"is_smoke": opts.is_smoke, "seconds": opts.seconds,
                           "num_clients": opts.num_clients, "gateway_only": True},
                "machine": machine_info(), "versions": package_versions(),
                "gateway_overhead": overhead}  # fmt: skip
    with fresh_database() as store_url:
        runs, failover = measure_scaling(opts, store_url, work_dir, bodies)
        summary = evaluate(runs)
        if failover is None:
            rate = failover_rate(runs)
            failover = measure_failover(opts, store_url, work_dir, bodies, rate)
        overhead = measure_overhead(opts, store_url, work_dir, bodies)
    return {
        "inputs": {
            "is_smoke": opts.is_smoke, "seconds": opts.seconds, "num_clients": opts.num_clients,
            "slow_model": SLOW_MODEL, "fast_model": FAST_MODEL,
            "ceiling_workers": opts.ceiling_workers,
        },
        "machine": machine_info(),
        "versions": package_versions(),
        "runs": runs,
        "summary": summary,
        "failover": failover,
        "gateway_overhead": overhead,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Run, write fleet.json and fleet.png, print the summary."""
    opts = parse_options(argv)
    result = run_benchmark(opts)
    if opts.gateway_only:
        write_json(opts.out_dir / "fleet_gateway.json", result)
        write_gateway_png(opts.out_dir / "fleet_gateway.png", result)
        print(json.dumps(result["gateway_overhead"]["summary"], indent=2))
        return
    write_json(opts.out_dir / "fleet.json", result)
    write_png(opts.out_dir / "fleet.png", result)
    print(json.dumps({"summary": result["summary"], "failover": {
        k: v for k, v in result["failover"].items() if k != "load"},
        "gateway_overhead": result["gateway_overhead"]["summary"]}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
