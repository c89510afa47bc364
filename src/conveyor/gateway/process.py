"""One gateway's state: holds no model; authenticates, admits, routes and answers.

It reads the worker registry from the shared job store, sends each online request to a
healthy worker hosting its model (see ``fleet.router``), retries failures on other workers
(``gateway.forward``) and exports the fleet's scaling signal (``fleet.scaling``).

It also serves ``/v1/files`` and ``/v1/batches`` on the fleet's shared job and object stores:
it plans and finalizes batches but runs no shards (``jobs.is_worker`` is off); the workers
claim the shards from the same stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.config.settings import ServerConfig
from conveyor.errors import ModelNotFound, QueueFull, ServiceUnavailable
from conveyor.fleet.affinity import AffinitySettings
from conveyor.fleet.credential import FleetCredential
from conveyor.fleet.failover import FailoverRamp, FailoverSettings
from conveyor.fleet.regions import RegionSettings, in_regions
from conveyor.fleet.registry import FleetRegistry, model_loads
from conveyor.fleet.registry_store import WorkerRegistryStore
from conveyor.fleet.route_hint import HintReader
from conveyor.fleet.router import Ejections, Router, WorkerView
from conveyor.fleet.scaling import ModelDemand, RateMeter, desired_replicas
from conveyor.fleet.upstream import PoolLimits, UpstreamPool
from conveyor.gateway.forward import Proxy, ProxySettings
from conveyor.jobs.object_stores import object_store_overrides
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.observability.metrics import GatewayMetrics
from conveyor.stores import ObjectStore, StoreError
from conveyor.tenants.budget import MonthlyBudgets

log = logging.getLogger(__name__)

WORKER_STATES = ("routable", "stale", "draining", "ejected")
# What a caller is told to wait while the registry is unsure: it rereads the store every
# `refresh_s` and is sure again `stale_after_s` after the store is back.
REGISTRY_RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """How a gateway finds workers, judges their health, retries and scales."""

    store_url: str
    objects_url: str | None = None
    # Object store URL by region, for the files of tenants pinned to regions.
    region_objects_urls: Mapping[str, str] = field(default_factory=dict)
    stale_after_s: float = 3.0
    reap_after_s: float = 60.0
    refresh_s: float = 0.25
    ejection_cooldown_s: float = 1.0
    max_attempts: int = 3
    connect_timeout_s: float = 1.0
    default_timeout_ms: float = 30_000
    max_in_flight: int = 4096
    # Connections to workers in use at once (long generation streams each hold one).
    max_connections: int = 256
    # Keep-alive connections kept idle per worker; an idle connection costs nothing per
    # request, and one too few means a TCP connect (on both ends) per request under load.
    max_idle_per_worker: int = 64
    target_utilisation: float = 0.7
    arrival_window_s: float = 10.0
    # Prefix and session affinity for generation requests (None: load alone decides).
    affinity: AffinitySettings | None = field(default_factory=AffinitySettings)
    # Model name -> checkpoint directory whose tokenizer hashes prompts for prefix routing.
    prefix_tokenizers: Mapping[str, str] = field(default_factory=dict)
    # This gateway's region and how far it prefers it; the admission ramp after a region
    # is lost (``fleet.failover``).
    regions: RegionSettings = field(default_factory=RegionSettings)
    failover: FailoverSettings = field(default_factory=FailoverSettings)

    def __post_init__(self) -> None:
        """Reject settings that would make the gateway route badly or never."""
        if self.stale_after_s <= 0 or self.refresh_s <= 0:
            raise ValueError("stale_after_s and refresh_s must be > 0")
        if self.reap_after_s < self.stale_after_s:
            raise ValueError("reap_after_s must be >= stale_after_s")
        if min(self.max_in_flight, self.max_connections, self.max_idle_per_worker) < 1:
            raise ValueError("max_in_flight and the connection limits must be >= 1")
        if not 0 < self.target_utilisation <= 1:
            raise ValueError("target_utilisation must be in (0, 1]")
        if self.default_timeout_ms <= 0 or self.arrival_window_s <= 0:
            raise ValueError("default_timeout_ms and arrival_window_s must be > 0")


def parse_model_dirs(pairs: list[str]) -> dict[str, str]:
    """``MODEL=DIR`` pairs (``--prefix-tokenizer``) as a mapping; a bad pair is a ValueError."""
    result: dict[str, str] = {}
    for pair in pairs:
        model, sep, directory = pair.partition("=")
        if not sep or not model or not directory:
            raise ValueError(f"--prefix-tokenizer takes MODEL=DIR, got {pair!r}")
        result[model] = directory
    return result


class Gateway:
    """One gateway's state: registry view, router, proxy, admission and scaling meters."""

    def __init__(
        self,
        settings: GatewaySettings,
        store: WorkerRegistryStore,
        *,
        objects: ObjectStore | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        credential: FleetCredential | None = None,
        tenant_regions: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """A gateway on ``store``'s worker registry; ``clock`` is the registry's wall clock;
        with ``credential`` it calls workers with the fleet key, vouching for its callers;
        ``tenant_regions`` pins tenants to regions (residency)."""
        self.settings = settings
        self.store = store
        self.objects = objects
        self.credential = credential
        self.metrics = GatewayMetrics()
        self.registry = FleetRegistry(
            store, stale_after_s=settings.stale_after_s, reap_after_s=settings.reap_after_s,
            clock=clock,
        )  # fmt: skip
        self.router = Router(
            rng or random.Random(),
            Ejections(settings.ejection_cooldown_s),
            affinity=settings.affinity,
            regions=settings.regions,
        )
        self.tenant_regions = {t: frozenset(r) for t, r in (tenant_regions or {}).items()}
        self.failover = FailoverRamp(settings.failover)
        self.hints = HintReader(settings.prefix_tokenizers, settings.affinity or AffinitySettings())
        self.num_in_flight = 0
        self._arrivals: dict[str, RateMeter] = {}
        self._upstream: UpstreamPool | None = None
        self._proxy: Proxy | None = None
        self._refresh_task: asyncio.Task[None] | None = None

    @property
    def proxy(self) -> Proxy:
        """The proxy (exists between ``start`` and ``stop``)."""
        if self._proxy is None:
            raise RuntimeError("the gateway is not started")
        return self._proxy

    async def start(self) -> None:
        """Open the worker connection pool and start refreshing the registry."""
        limits = PoolLimits(
            max_connections=self.settings.max_connections,
            max_idle_per_worker=self.settings.max_idle_per_worker,
            connect_timeout_s=self.settings.connect_timeout_s,
        )
        self._upstream = UpstreamPool(limits)
        self._proxy = Proxy(
            self._upstream,
            self.router,
            lambda: self.registry.views,
            ProxySettings(self.settings.max_attempts, self.settings.connect_timeout_s),
            self.metrics,
            wall_clock=time.time,
        )
        await asyncio.to_thread(self.hints.preload)
        try:
            await self.registry.refresh()
            self.on_refresh()
        except StoreError as exc:
            # Not fatal: /ready stays 503 until the refresh loop gets through.
            log.warning("first worker registry read failed: %s", exc)
        self._refresh_task = asyncio.create_task(
            self.registry.run(self.settings.refresh_s, self.on_refresh), name="fleet-registry"
        )

    async def stop(self) -> None:
        """Stop refreshing and close connections and the store."""
        if self._refresh_task is not None:
            self._refresh_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh_task
        if self._upstream is not None:
            self._upstream.close()
        await asyncio.to_thread(self.store.close)

    def routable(self, now: float | None = None) -> list[WorkerView]:
        """Workers that may get traffic now."""
        at = time.time() if now is None else now
        return [view for view in self.registry.views if self.router.is_routable(view, at)]

    def healthy_models(self) -> list[str]:
        """The union of the models of routable workers, sorted."""
        return sorted({model for view in self.routable() for model in view.models})

    def registered_models(self) -> set[str]:
        """Every model some registered, non-stale worker hosts (routable or not)."""
        return {m for view in self.registry.views if not view.is_stale for m in view.models}

    def check_model(self, model: str) -> None:
        """Return if some registered worker hosts ``model``; else raise why not.

        404 once the registry is sure no worker hosts it; 503 with ``Retry-After`` while it
        is unsure (a store outage makes the workers' rows look stale) and the model may be
        hosted: a served model is never answered "does not exist" for the store's sake.
        """
        if model in self.registered_models():
            return
        if self.registry.is_unsure() and self.registry.may_host(model):
            raise ServiceUnavailable(
                f"the worker registry cannot tell now whether a worker hosts {model!r}",
                code="registry_unsure", retry_after_s=REGISTRY_RETRY_AFTER_S,
            )  # fmt: skip
        raise ModelNotFound(f"the model {model!r} does not exist", param="model")

    def may_serve_batch_lines(self, model: str) -> bool:
        """Whether a batch naming ``model`` may be planned: a healthy worker hosts it, or the
        registry is unsure and some worker may (a store outage must not fail a batch whose
        model is served; its shards wait for a worker to claim them)."""
        if model in self.healthy_models():
            return True
        return self.registry.is_unsure() and self.registry.may_host(model)

    def check_residency(self, tenant: str, model: str) -> frozenset[str] | None:
        """The regions ``tenant`` is pinned to (None: any); 503 when no routable worker in
        them hosts ``model`` (never a worker elsewhere)."""
        regions = self.tenant_regions.get(tenant)
        if regions is None:
            return None
        if not any(model in view.models for view in in_regions(self.routable(), regions)):
            raise ServiceUnavailable(
                f"no worker hosting {model!r} is up in the regions tenant {tenant!r} is "
                f"pinned to ({', '.join(sorted(regions))})", code="no_worker_in_region",
            )  # fmt: skip
        return regions

    def admit_failover(self, model: str) -> None:
        """429 with Retry-After beyond the admission ramp after a region was lost."""
        wait_s = self.failover.admit(model, time.time())
        if wait_s is not None:
            raise QueueFull(
                "a region's workers are gone and their traffic is admitted gradually; retry "
                "shortly", retry_after_s=int(wait_s), code="failover_ramp",
            )  # fmt: skip

    def count_arrival(self, model: str, num_inputs: int) -> None:
        """Feed the arrival-rate meter of ``model``."""
        meter = self._arrivals.get(model)
        if meter is None:
            meter = self._arrivals[model] = RateMeter(self.settings.arrival_window_s)
        meter.record(time.monotonic(), num_inputs)

    def demands(self) -> list[ModelDemand]:
        """Per model: arrivals here, queue and service rate across routable workers."""
        now_mono = time.monotonic()
        routable = self.routable()
        models = self.registered_models() | set(self._arrivals)
        records = {r.worker_id: r for r in self.registry.records}
        demands = []
        for model in sorted(models):
            hosts = [v for v in routable if model in v.models]
            loads = [model_loads(records[v.worker_id])[model] for v in hosts]
            rates = [load.service_per_s for load in loads if load.service_per_s > 0]
            meter = self._arrivals.get(model)
            demands.append(
                ModelDemand(
                    model=model,
                    arrival_per_s=meter.rate_per_s(now_mono) if meter else 0.0,
                    service_per_s_per_replica=sum(rates) / len(rates) if rates else 0.0,
                    queue_depth=sum(load.queue_depth for load in loads),
                    num_replicas=len(hosts),
                )
            )
        return demands

    def on_refresh(self) -> None:
        """After each registry refresh: forget vanished workers, update the gauges."""
        self.router.forget_missing({v.worker_id for v in self.registry.views})
        if not self.registry.is_unsure():  # stale rows in an outage are no lost region
            now_mono = time.monotonic()
            rates = {m: meter.rate_per_s(now_mono) for m, meter in self._arrivals.items()}
            up = {view.region for view in self.routable() if view.region}
            self.failover.observe(up, rates, time.time())
        self._gauge_workers()
        for demand in self.demands():
            replicas = desired_replicas(demand, self.settings.target_utilisation)
            self.metrics.fleet_queue_depth.labels(demand.model).set(demand.queue_depth)
            self.metrics.arrival_rate.labels(demand.model).set(demand.arrival_per_s)
            self.metrics.service_rate.labels(demand.model).set(
                demand.service_per_s_per_replica * demand.num_replicas
            )
            self.metrics.desired_replicas.labels(demand.model).set(replicas)

    def _gauge_workers(self) -> None:
        """Workers per model and routing state (the KEDA query divides by the routable ones)."""
        now = time.time()
        counts: dict[str, dict[str, int]] = {}
        for view in self.registry.views:
            state = self._routing_state(view, now)
            for model in view.models:
                per_state = counts.setdefault(model, dict.fromkeys(WORKER_STATES, 0))
                per_state[state] += 1
        self.metrics.workers.clear()  # models no worker hosts any more disappear
        for model, per_state in counts.items():
            for state, count in per_state.items():
                self.metrics.workers.labels(model, state).set(count)

    def _routing_state(self, view: WorkerView, now: float) -> str:
        if view.is_stale:
            return "stale"
        if view.is_draining or self.router.drained.is_draining(view):
            return "draining"
        if self.router.ejections.is_ejected(view, now):
            return "ejected"
        return "routable"


async def _no_shards_here(endpoint: str, body: dict[str, Any], payer: object) -> dict[str, Any]:
    """A gateway's jobs subsystem never runs shards (``is_worker`` is off); refuse loudly."""
    raise ServiceUnavailable("the gateway runs no batch lines; workers do")


def gateway_jobs(gateway: Gateway, config: ServerConfig) -> JobsSubsystem:
    """Files and Batches on the shared stores: plans and finalizes batches, runs no shards.

    A batch's model counts as served when a healthy worker in the registry hosts it (or
    may, while the registry is unsure).
    """
    settings = gateway.settings
    overrides = object_store_overrides(config.jobs, settings.objects_url,
                                       settings.region_objects_urls)  # fmt: skip
    overrides.update({"job_store_url": settings.store_url, "is_worker": False})
    jobs_config = config.jobs.model_copy(update=overrides)
    return JobsSubsystem(
        jobs_config,
        config.data_dir,
        _no_shards_here,
        gateway.may_serve_batch_lines,
        budgets=MonthlyBudgets(config.tenancy.budgets_usd),
        batch_queue_tokens=config.tenancy.batch_queue_tokens,
        tenant_regions=config.tenancy.regions,
    )
