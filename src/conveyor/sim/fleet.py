"""The simulated fleet: workers and gateways per region, heartbeats into the shared store,
and the once-a-second sampling of every worker's gauges.

A worker's heartbeat carries the load a real one reports (``cli.worker.service_load``'s
shape: per model its queue depth and, with affinity on, its prefix digest), upserted into
the store every ``heartbeat_s``; each gateway's ``FleetRegistry`` reads the rows from
there, so staleness, reaping and a store outage act as in the product.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.plan.curves import LinearCurve
from conveyor.plan.gpus import gpu_spec
from conveyor.plan.shape import ModelShape
from conveyor.prefix.report import prefix_report
from conveyor.sim.clock import Clock
from conveyor.sim.counted_worker import CountedLlmWorker, check_counted
from conveyor.sim.gateway import SimGateway
from conveyor.sim.llm_worker import LlmWorker
from conveyor.sim.metrics import Metrics
from conveyor.sim.oneshot_worker import OneShotWorker
from conveyor.sim.request import Outcome, SimRequest
from conveyor.sim.scenario import ModelSpec, Scenario
from conveyor.sim.store import SimStore
from conveyor.sim.timemodel import Calibration, LlmStepTime, kv_tokens_on
from conveyor.sim.worker import SimWorker
from conveyor.stores.errors import StoreError
from conveyor.tenants.config import ModelLimits


@dataclass(slots=True)
class Fleet:
    """Everything that serves: workers, gateways, the store."""

    clock: Clock
    metrics: Metrics
    store: SimStore
    workers: dict[str, SimWorker] = field(default_factory=dict)
    gateways: dict[str, SimGateway] = field(default_factory=dict)
    # Heartbeats a worker skips (a stale-heartbeat fault), by worker id.
    muted: set[str] = field(default_factory=set)
    # ``gateways_in``'s lists, by region, as of the number of gateways killed then.
    _live: dict[str | None, tuple[int, list[SimGateway]]] = field(default_factory=dict)
    num_gateways_killed: int = 0

    def gateways_in(self, region: str | None) -> list[SimGateway]:
        """Live gateways of ``region`` (None: every region); the list is shared, read it
        only. Every request asks: it is kept until a gateway is killed (``kill_gateway``)."""
        known = self._live.get(region)
        if known is not None and known[0] == self.num_gateways_killed:
            return known[1]
        live = [g for g in self.gateways.values()
                if g.is_alive and (region is None or g.region == region)]  # fmt: skip
        self._live[region] = (self.num_gateways_killed, live)
        return live

    def kill_gateway(self, gateway: SimGateway) -> None:
        """``gateway`` dies (see ``SimGateway.kill``)."""
        gateway.kill()
        self.num_gateways_killed += 1


def build_fleet(scenario: Scenario, clock: Clock, metrics: Metrics, rng: random.Random) -> Fleet:
    """Workers and gateways as the scenario's fleet lists them."""
    spec = scenario.fleet
    if spec is None:
        raise ValueError("the scenario has no fleet")
    check_counted(scenario)
    fleet = Fleet(clock, metrics, SimStore())
    timing = _timing(scenario)
    hop_s = timing.hop_s if timing.hop_s is not None else scenario.time_model.hop_ms / 1e3
    overhead_s = timing.request_overhead_s or scenario.time_model.request_overhead_ms / 1e3
    limits = {t.name: ModelLimits(rpm=t.rpm, input_tpm=t.input_tpm, output_tpm=t.output_tpm)
              for t in scenario.tenants}  # fmt: skip
    index = 0
    for region in spec.regions:
        for _ in range(region.workers):
            worker_id = f"w{index}"
            fleet.workers[worker_id] = _worker(scenario, worker_id, region.name, clock, metrics,
                                               timing, overhead_s)  # fmt: skip
            index += 1
    gateway_index = 0
    for region in spec.regions:
        for _ in range(region.gateways):
            gateway_id = f"g{gateway_index}"
            fleet.gateways[gateway_id] = SimGateway(
                gateway_id, region.name, clock, spec, fleet.store, fleet.workers, metrics,
                random.Random(rng.random()), hop_s=hop_s, limits=limits,
            )  # fmt: skip
            gateway_index += 1
    return fleet


def _timing(scenario: Scenario) -> Calibration:
    """The time model: the calibration file's terms, else the GPU preset's."""
    tm = scenario.time_model
    if tm.calibration:
        return Calibration.load(Path(scenario.base_dir) / tm.calibration)
    model = scenario.fleet.model if scenario.fleet else None
    llm = None
    if model is not None and model.kind == "llm" and tm.gpu is not None:
        llm = LlmStepTime.from_preset(model_shape(model), gpu_spec(tm.gpu))
    curve = LinearCurve(tm.one_shot_fixed_ms / 1e3, tm.one_shot_per_item_ms / 1e3)
    return Calibration(llm, curve)


def model_shape(m: ModelSpec) -> ModelShape:
    """The plan's shape of the scenario's model."""
    head = m.kv_heads * m.head_dim
    return ModelShape(m.name, round(m.params_b * 1e9), m.dtype_bytes, m.layers, m.kv_heads,
                      m.head_dim, hidden_size=head, kv_dtype_bytes=m.dtype_bytes)  # fmt: skip


def _worker(
    scenario: Scenario, worker_id: str, region: str, clock: Clock, metrics: Metrics,
    timing: Calibration, overhead_s: float,
) -> SimWorker:  # fmt: skip
    spec = scenario.fleet
    if spec is None:
        raise ValueError("the scenario has no fleet")
    if spec.model.kind == "one_shot":
        if timing.one_shot is None:
            raise ValueError("a one-shot model needs one_shot terms in the calibration")
        return OneShotWorker(worker_id, region, clock, spec.batching, timing.one_shot, metrics,
                             request_overhead_s=overhead_s)  # fmt: skip
    if timing.llm is None:
        raise ValueError("an llm model needs a gpu preset or llm terms in the calibration")
    kv_tokens = spec.engine.kv_tokens
    if kv_tokens is None:
        if scenario.time_model.gpu is None:
            raise ValueError("engine.kv_tokens is needed with a calibration file")
        kv_tokens = kv_tokens_on(model_shape(spec.model), gpu_spec(scenario.time_model.gpu))
        kv_tokens = min(kv_tokens, spec.engine.max_num_seqs * spec.engine.max_model_len)
    if spec.engine.decode_model == "counted":
        return CountedLlmWorker(worker_id, region, clock, spec.engine, timing.llm, kv_tokens,
                                metrics, request_overhead_s=overhead_s)  # fmt: skip
    keeps_digest = spec.affinity is not None and spec.affinity.use_prefix
    return LlmWorker(worker_id, region, clock, spec.engine, timing.llm, kv_tokens, metrics,
                     request_overhead_s=overhead_s, keeps_digest=keeps_digest)  # fmt: skip


def heartbeat(
    fleet: Fleet, worker: SimWorker, model: str, spec_s: float, with_prefix: bool
) -> None:
    """Upsert the worker's row now, and again every ``spec_s`` while it lives."""
    if not worker.is_alive:
        return
    if worker.worker_id not in fleet.muted:
        entry = {"queue_depth": 0, "service_per_s": 0.0, "is_loaded": True, **worker.load()}
        if with_prefix and isinstance(worker, LlmWorker):
            hashes = worker.digest.hashes
            entry["prefix"] = prefix_report(worker.blocks.block_size, hashes)
        load = {"is_draining": False, "models": {model: entry}}
        try:
            fleet.store.upsert_worker(worker.worker_id, f"http://{worker.worker_id}:8000",
                                      [model], 1, load, fleet.clock.now)  # fmt: skip
        except StoreError:
            fleet.metrics.add("heartbeat_failures", fleet.clock.now)
    fleet.clock.after(spec_s, heartbeat, fleet, worker, model, spec_s, with_prefix)


def sample(fleet: Fleet, every_s: float) -> None:
    """Record the fleet's gauges for this second, then again in ``every_s``."""
    now = fleet.clock.now
    totals: dict[str, float] = {}
    alive = [w for w in fleet.workers.values() if w.is_alive]
    for worker in alive:
        for name, value in worker.sample(now).items():
            totals[name] = totals.get(name, 0.0) + value
    for name, value in totals.items():
        shown = value / len(alive) if name == "kv_use" else value
        fleet.metrics.gauge(name, now, shown)
    fleet.metrics.gauge("workers_alive", now, len(alive))
    fleet.clock.after(every_s, sample, fleet, every_s)


def send_to_gateway(fleet: Fleet, rng: random.Random, region: str | None, req: SimRequest) -> None:
    """A caller's request reaches a live gateway of its region (a load balancer's pick)."""
    fleet.metrics.arrived(req)
    gateways = fleet.gateways_in(region) or fleet.gateways_in(None)
    if not gateways:
        fleet.metrics.add("5xx_no_gateway", fleet.clock.now)
        fleet.metrics.answered(req, Outcome.FAILED_5XX, fleet.clock.now)
        return
    gateways[rng.randrange(len(gateways))].handle(req)
