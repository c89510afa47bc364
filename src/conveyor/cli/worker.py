"""The worker process: hosts models (the ``conveyor serve`` app) and joins the fleet.

It registers in the store's worker registry, heartbeats its load, and runs batch shards from
the shared job and object stores. On SIGTERM it drains: 503 for new work and deregistration
first (so gateways stop routing to it), then, at the same time, its shard leases are handed
back (so other workers take the shards over at once) and in-flight requests finish; only then
does the server shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.api.app import create_app
from conveyor.api.residency import Residency
from conveyor.api.server import uvicorn_config
from conveyor.asgi.json import error_response
from conveyor.config.settings import ServerConfig
from conveyor.distribution.manifest import MIB
from conveyor.distribution.peer import PeerNode, PeerSettings
from conveyor.distribution.resolver import has_remote_models
from conveyor.endpoints.dispatch import jobs_for_service
from conveyor.errors import ServiceUnavailable
from conveyor.fleet.credential import credential_from
from conveyor.fleet.drain import DRAINING_HEADER
from conveyor.fleet.heartbeat import Heartbeat, WorkerIdentity
from conveyor.fleet.model_load import generative_load
from conveyor.fleet.registry_store import WorkerRegistryStore
from conveyor.host.service import Service
from conveyor.jobs.object_stores import object_store_overrides
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.observability.metrics import Metrics
from conveyor.prefix.report import prefix_report
from conveyor.stores import StoreError, open_job_store

log = logging.getLogger(__name__)

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
# Paths a draining worker refuses; /health and /metrics keep answering.
WORK_PREFIX = "/v1/"
# A registry entry older than this many heartbeats no longer vouches for its models.
STALE_HEARTBEATS = 3


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Where a worker listens, how it is reached, and how it heartbeats and drains."""

    store_url: str
    objects_url: str | None = None
    # Object store URL by region, for the files of tenants pinned to regions.
    region_objects_urls: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8001
    advertise: str | None = None
    worker_id: str | None = None
    heartbeat_s: float = 1.0
    drain_timeout_s: float = 30.0
    # Model distribution: the chunk server's listener (port 0: any free), zone label and
    # upload cap (None: uncapped).
    peer_host: str = "127.0.0.1"
    peer_port: int = 0
    peer_advertise: str | None = None
    zone: str | None = None
    peer_upload_mb_s: float | None = None
    # Its region (gateways prefer their own; resident tenants are served only in theirs).
    region: str | None = None

    def __post_init__(self) -> None:
        """Validate the knobs."""
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.heartbeat_s <= 0 or self.drain_timeout_s < 0:
            raise ValueError("heartbeat_s must be > 0 and drain_timeout_s >= 0")
        if self.peer_upload_mb_s is not None and self.peer_upload_mb_s <= 0:
            raise ValueError(f"--peer-upload-mb-s must be > 0, got {self.peer_upload_mb_s}")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8001`` for IPv6) as a pair; ValueError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class DrainGate:
    """ASGI middleware counting in-flight work requests; answers 503 once draining."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.is_draining = False
        self.num_in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if self.is_draining and (path.startswith(WORK_PREFIX) or path == "/ready"):
            response = error_response(ServiceUnavailable("this worker is draining"))
            response.headers[DRAINING_HEADER.decode()] = "1"  # gateways stop routing here
            await response(scope, receive, send)
            return
        if not path.startswith(WORK_PREFIX):
            await self.app(scope, receive, send)
            return
        self.num_in_flight += 1
        self._idle.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self.num_in_flight -= 1
            if self.num_in_flight == 0:
                self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait for in-flight requests; False if the timeout hit first."""
        self.is_draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


def service_load(service: Service, gate: DrainGate) -> dict[str, Any]:
    """The load a heartbeat reports: in flight, draining, and per model queue and rate."""
    models: dict[str, Mapping[str, Any]] = {}
    for hosted in service.models():
        batcher = hosted.batcher
        models[hosted.config.name] = {
            "queue_depth": batcher.queue.num_queued,
            "running": batcher.num_running,
            "service_per_s": round(batcher.timing.service_rate(batcher.settings.max_batch_size), 3),
            "is_loaded": True,
        }
    # Not loaded now (a memory budget evicted it, or it was never used): routable, but
    # gateways prefer a worker that has it loaded.
    for unloaded in service.unloaded_models():
        models[unloaded.name] = {"queue_depth": 0, "service_per_s": 0.0, "is_loaded": False}
    # Generative models run their own scheduler: their load is the engine's sequences
    # waiting plus running (as vLLM's gauges count it), so a gateway's router weighs what
    # other gateways sent too, with a digest of their prefix cache for prefix-aware
    # routing. LoRA adapters share their base model's engine, so its load, and route like
    # models (no digest: their prefix blocks are keyed by adapter).
    for name, generator in service.generators.items():
        engine = generator.engine
        load = generative_load(engine.num_waiting, engine.num_running, engine.num_batch)
        digest = prefix_report(engine.config.block_size, engine.prefix_digest.hashes)
        models[name] = {**models.get(name, {}), **load, "prefix": digest}
        for adapter in generator.adapter_names():
            models.setdefault(adapter, dict(load))
    return {"in_flight": gate.num_in_flight, "is_draining": gate.is_draining, "models": models}


class _DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM starts a drain instead of a shutdown."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.drain_requested = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.drain_requested.is_set():
            self._loop.call_soon_threadsafe(self.drain_requested.set)
            return
        super().handle_exit(sig, frame)

    @property
    def bound_port(self) -> int:
        """The port actually bound (differs from the config when it asked for 0)."""
        for server in self.servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        raise RuntimeError("the server is not listening")


def advertised_address(settings: WorkerSettings, port: int) -> str:
    """The URL gateways use to reach this worker."""
    if settings.advertise:
        return settings.advertise.rstrip("/")
    host = socket.gethostname() if settings.host in WILDCARD_HOSTS else settings.host
    return f"http://{host}:{port}"


def worker_config(config: ServerConfig, settings: WorkerSettings, worker_id: str) -> ServerConfig:
    """``config`` with its jobs section on the fleet's shared stores, as this worker."""
    overrides = object_store_overrides(config.jobs, settings.objects_url,
                                       settings.region_objects_urls)  # fmt: skip
    overrides.update({"job_store_url": settings.store_url, "is_worker": True,
                      "worker_id": worker_id})  # fmt: skip
    if settings.region:
        overrides["region"] = settings.region
    return config.model_copy(update={"jobs": config.jobs.model_copy(update=overrides)})


def fleet_model_check(
    config: ServerConfig, store: WorkerRegistryStore, stale_after_s: float
) -> Callable[[str], bool]:
    """Whether a batch's model is served: here, or by a live worker in the registry.

    Any worker's supervisor may plan a batch, so a model hosted only elsewhere must not fail
    it. Called from the planner's thread, so the blocking store read is fine.
    """

    def is_model_served(name: str) -> bool:
        if config.model(name) is not None:
            return True
        try:
            records = store.list_workers(time.time(), stale_after_s)
        except StoreError:
            return False
        return any(name in record.models and not record.is_stale for record in records)

    return is_model_served


def worker_identity(service: Service, worker_id: str, address: str) -> WorkerIdentity:
    """What the worker registers: the models it hosts, less those whose pull failed (a
    gateway must not route a model here that can only answer 503)."""
    hosted = [m for m in service.config.models if m.name not in service.failed_models]
    return WorkerIdentity(
        worker_id=worker_id,
        address=address,
        models=tuple(model.name for model in hosted),
        capacity=sum(model.max_batch_size for model in hosted),
    )


def worker_jobs(
    service: Service, store: WorkerRegistryStore, stale_after_s: float
) -> JobsSubsystem:
    """The worker's jobs subsystem: runs shards on ``service``, checks models fleet-wide."""
    check = fleet_model_check(service.config, store, stale_after_s)
    return jobs_for_service(service, is_model_served=check)


async def serve_worker(config: ServerConfig, settings: WorkerSettings) -> None:
    """Run a worker until it has drained after SIGTERM (or uvicorn stopped on SIGINT)."""
    store = open_job_store(settings.store_url)
    worker_id = settings.worker_id or f"{socket.gethostname()}-{secrets.token_hex(4)}"
    config = worker_config(config, settings, worker_id)
    metrics = Metrics()
    peer = await _start_peer(config, settings, worker_id, store, metrics)
    service = Service(config, metrics=metrics, model_resolver=peer.resolver if peer else None)
    jobs = worker_jobs(service, store, STALE_HEARTBEATS * settings.heartbeat_s)
    app = create_app(
        config, service=service, jobs=jobs, with_rate_limits=False,
        fleet_credential=credential_from(config.fleet),
        residency=Residency(config.jobs.region, config.tenancy.regions),
    )  # fmt: skip
    gate = DrainGate(app)
    server = _DrainingServer(
        uvicorn_config(
            gate, config, host=settings.host, port=settings.port, timeout_keep_alive=30,
            timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
        )
    )  # fmt: skip
    serving = asyncio.create_task(server.serve(), name="uvicorn")
    try:
        # uvicorn exposes no start-up event, only the ``started`` flag.
        while not server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if serving.done():
            await serving  # re-raises why uvicorn stopped (a port in use, a failed start-up)
            return
        address = advertised_address(settings, server.bound_port)
        identity = worker_identity(service, worker_id, address)
        await _beat_until_drain(server, serving, store, identity, service, gate, jobs, settings)
        await serving
    finally:
        if peer is not None:
            await peer.stop(worker_id)
        await asyncio.to_thread(store.close)


async def _start_peer(
    config: ServerConfig, settings: WorkerSettings, worker_id: str, store: Any, metrics: Metrics
) -> PeerNode | None:
    """The chunk server and puller, when some model entry names a pushed model."""
    if not has_remote_models(config):
        return None
    upload_mb_s = settings.peer_upload_mb_s
    peer_settings = PeerSettings(
        worker_id=worker_id, host=settings.peer_host, port=settings.peer_port,
        advertise=settings.peer_advertise, zone=settings.zone, touch_every_s=settings.heartbeat_s,
        upload_bytes_s=None if upload_mb_s is None else upload_mb_s * MIB,
    )  # fmt: skip
    return await PeerNode.start(config, store, peer_settings, metrics.distribution)


async def _beat_until_drain(
    server: _DrainingServer,
    serving: asyncio.Task[None],
    store: Any,
    identity: WorkerIdentity,
    service: Service,
    gate: DrainGate,
    jobs: JobsSubsystem,
    settings: WorkerSettings,
) -> None:
    """Heartbeat while serving; on a drain request stop beating, deregister, drain, exit.

    Shards are released while the HTTP drain runs, not after it: the model keeps serving
    in-flight requests, and other workers need not wait out this worker's drain. The job
    store stays open until the lifespan stops the jobs subsystem at shutdown, after the
    usage ledger's last write (the requests that finish during the drain are billed).
    """
    heartbeat = Heartbeat(
        store,
        identity,
        lambda: {**service_load(service, gate), "region": settings.region},
        interval_s=settings.heartbeat_s,
    )
    beating = asyncio.create_task(heartbeat.run(), name="heartbeat")
    log.info("worker %s registered at %s", identity.worker_id, identity.address)
    drain_wait = asyncio.create_task(server.drain_requested.wait())
    await asyncio.wait({drain_wait, serving}, return_when=asyncio.FIRST_COMPLETED)
    drain_wait.cancel()
    await heartbeat.stop(beating)
    if not server.drain_requested.is_set():
        await heartbeat.deregister()
        return
    gate.is_draining = True
    await heartbeat.deregister()
    log.info("draining: %d requests in flight", gate.num_in_flight)
    _, is_drained = await asyncio.gather(jobs.release(), gate.drain(settings.drain_timeout_s))
    if not is_drained:
        log.warning("drain timed out with %d requests in flight", gate.num_in_flight)
    server.should_exit = True


def run_worker(config: ServerConfig, settings: WorkerSettings) -> None:
    """Blocking entry point for ``conveyor worker`` (uvloop when installed)."""
    loop_factory: Any = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve_worker(config, settings))
