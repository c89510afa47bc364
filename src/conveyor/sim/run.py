"""One simulation run: build the fleet, start heartbeats, traffic, jobs and faults, run the
clock, and total the figures.

Traffic runs for ``duration_s``; then the run drains for up to ``drain_s`` more (no new
arrivals) and stops early once every request is answered and every job is done. A request
still unanswered at the end is lost; one answered twice is duplicated: both must be 0.
"""

from __future__ import annotations

import contextlib
import gc
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from conveyor.sim.clock import Clock
from conveyor.sim.counted_worker import CountedLlmWorker
from conveyor.sim.faults import schedule_faults
from conveyor.sim.fleet import Fleet, build_fleet, heartbeat, sample, send_to_gateway
from conveyor.sim.jobs import BatchJob, JobRunner
from conveyor.sim.llm_worker import LlmWorker
from conveyor.sim.metrics import Metrics
from conveyor.sim.request import SimRequest
from conveyor.sim.scenario import Scenario, TrafficSpec
from conveyor.sim.traffic import ChatSession, PoissonSource, Prompts
from conveyor.sim.worker import SimWorker

SAMPLE_EVERY_S = 1.0
# Allocations before the youngest generation is collected, collections before the next.
COLLECT_THRESHOLD = (200_000, 50, 1000)


@dataclass(slots=True)
class Run:
    """A finished run: its totals, its per-second series, and the raw parts for tests."""

    totals: dict[str, Any]
    series: dict[str, Any]
    fleet: Fleet
    jobs: list[BatchJob]


def simulate(scenario: Scenario, seed: int | None = None) -> Run:
    """Run ``scenario`` with ``seed`` (default: the scenario's) and total it."""
    with _few_collections():
        return _simulate(scenario, seed)


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """Collect cyclic garbage seldom while a run allocates: a large run holds millions of
    live objects (requests in flight, latencies), and collections every 700 allocations
    that look through them cost a third of its time. Nothing else changes."""
    threshold = gc.get_threshold()
    gc.set_threshold(*COLLECT_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def _simulate(scenario: Scenario, seed: int | None) -> Run:
    started, cpu_started = time.perf_counter(), time.process_time()
    seed = scenario.seed if seed is None else seed
    rng = random.Random(seed)
    clock, metrics = Clock(), Metrics(SAMPLE_EVERY_S)
    fleet = build_fleet(scenario, clock, metrics, rng)
    spec = scenario.fleet
    if spec is None:
        raise ValueError("the scenario has no fleet")
    counted = spec.engine.decode_model == "counted"
    prompts = Prompts(random.Random(rng.random()), spec.affinity is not None, counted)
    _start_fleet(fleet, scenario, rng)
    jobs = _start_traffic(fleet, scenario, prompts, rng)
    runners = _start_runners(fleet, jobs, prompts)

    def on_death(worker: SimWorker) -> None:
        runner = runners.get(worker.worker_id)
        if runner is not None:
            runner.on_death()

    schedule_faults(fleet, scenario.faults, on_death)
    clock.at(0.0, sample, fleet, SAMPLE_EVERY_S)
    clock.run(scenario.duration_s)

    def is_idle() -> bool:
        return not metrics.open and all(job.finished_at_s is not None for job in jobs)

    clock.run(scenario.duration_s + scenario.drain_s, idle=is_idle)
    totals = _totals(scenario, seed, fleet, jobs, time.perf_counter() - started)
    # On a shared machine the wall time says how busy it was; the CPU time, what it cost.
    totals["cpu_seconds"] = round(time.process_time() - cpu_started, 3)
    return Run(totals, metrics.series(), fleet, jobs)


def _start_fleet(fleet: Fleet, scenario: Scenario, rng: random.Random) -> None:
    """First heartbeats and registry reads at 0, then each on its own phase."""
    spec = scenario.fleet
    if spec is None:
        raise ValueError("the scenario has no fleet")
    with_prefix = spec.affinity is not None and spec.affinity.use_prefix
    for worker in fleet.workers.values():
        fleet.clock.at(0.0, heartbeat, fleet, worker, spec.model.name, spec.heartbeat_s,
                       with_prefix)  # fmt: skip
    for gateway in fleet.gateways.values():
        fleet.clock.at(0.0, gateway.refresh)


def _start_traffic(
    fleet: Fleet, scenario: Scenario, prompts: Prompts, rng: random.Random
) -> list[BatchJob]:
    """Sources on the clock; batch jobs created in the store."""
    jobs: list[BatchJob] = []
    for spec in scenario.traffic:
        send = _sender(fleet, rng, spec)
        if spec.kind == "poisson":
            PoissonSource(spec, fleet.clock, prompts, send, scenario.duration_s).start()
        elif spec.kind in ("chat", "closed"):
            for index in range(spec.sessions):
                session = ChatSession(spec, f"{spec.name}-{index}", fleet.clock, prompts, send)
                if spec.stagger_s is None:
                    session.start(spec.start_s + rng.uniform(0, max(spec.think_s, 1e-3)))
                else:
                    session.start(spec.start_s + index * spec.stagger_s)
        else:
            jobs.append(BatchJob(spec, len(jobs), fleet.store, spec.start_s))
    return jobs


def _sender(fleet: Fleet, rng: random.Random, spec: TrafficSpec):  # type: ignore[no-untyped-def]
    def send(request: SimRequest) -> None:
        send_to_gateway(fleet, rng, spec.region, request)

    return send


def _start_runners(fleet: Fleet, jobs: list[BatchJob], prompts: Prompts) -> dict[str, JobRunner]:
    """A shard runner on every generative worker, when there are jobs."""
    runners: dict[str, JobRunner] = {}
    if not jobs:
        return runners
    for worker in fleet.workers.values():
        runner = JobRunner(worker, fleet.clock, fleet.store, jobs, fleet.metrics, prompts)
        runner.start(min(job.spec.start_s for job in jobs))
        runners[worker.worker_id] = runner
    return runners


def _totals(
    scenario: Scenario, seed: int, fleet: Fleet, jobs: list[BatchJob], wall_s: float
) -> dict[str, Any]:
    """The run's headline figures (the ``--json`` object)."""
    m = fleet.metrics
    latency = m.latency_totals()
    prompt = m.total("prompt_tokens")
    completed = m.total("completed")
    in_window = sum(
        v for k, v in m.counts["completed"].items() if k * m.bucket_s < scenario.duration_s
    )
    fivexx = {k[4:]: int(m.total(k)) for k in sorted(m.counts) if k.startswith("5xx_")}
    llm = (LlmWorker, CountedLlmWorker)
    steps = sum(w.num_steps for w in fleet.workers.values() if isinstance(w, llm))
    retry = m.retry_after_s
    return {
        "scenario": scenario.name, "seed": seed,
        "requests": m.num_requests, "completed": int(completed), "lost": m.lost(fleet.clock.now),
        "unfinished_at_end": m.unfinished(fleet.clock.now),
        "duplicated": int(m.total("duplicated")) + sum(j.shards_committed_twice for j in jobs),
        "rejected_429": int(m.total("rejected_429")),
        "rejected_429_by_tenant_limits": int(m.total("tenant_429")),
        "failed_5xx": int(m.total("failed_5xx")), "failed_5xx_by_reason": fivexx,
        "retry_after_s": {"mean": round(sum(retry) / len(retry), 2) if retry else None,
                          "max": max(retry, default=None)},
        "throughput_rps": round(in_window / scenario.duration_s, 3),
        "latency_ms": latency["e2e_ms"], "ttft_ms": latency["ttft_ms"],
        "tpot_ms": latency["tpot_ms"],
        "prefix_hit_ratio": round(m.total("prefix_hit_tokens") / prompt, 4) if prompt else None,
        "preemptions": int(m.total("preemptions")), "retries": int(m.total("retries")),
        "output_tokens_per_s": round(m.total("output_tokens") / scenario.duration_s, 1),
        "workers": len(fleet.workers), "gateways": len(fleet.gateways),
        "engine_steps": steps, "events": fleet.clock.num_events,
        "jobs": [_job_totals(job) for job in jobs],
        "lines_wasted": int(m.total("lines_wasted")),
        "job_lines_done_per_s": round(m.total("lines_done") / scenario.duration_s, 2),
        "sim_seconds": round(fleet.clock.now, 3), "wall_seconds": round(wall_s, 3),
        "speed_x": round(fleet.clock.now / wall_s, 2) if wall_s > 0 else None,
    }  # fmt: skip


def _job_totals(job: BatchJob) -> dict[str, Any]:
    lines = job.lines_committed
    return {
        "batch_id": job.batch_id, "tenant": job.spec.tenant, "lines": job.spec.lines,
        "lines_committed": lines, "shards": job.num_shards, "shards_committed": len(job.commits),
        "shards_committed_twice": job.shards_committed_twice,
        "finished_at_s": None if job.finished_at_s is None else round(job.finished_at_s, 3),
    }  # fmt: skip
