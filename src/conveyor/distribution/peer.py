"""A worker's part in peer-to-peer distribution: its chunk server, tracker liveness, puller.

`PeerNode.start` opens the chunk server on its own listener before any model loads (so peers
can fetch from a worker that is itself still pulling), announces the verified chunks already
on disk, and keeps this worker's holds fresh in the tracker: pullers ignore holds not touched
within their `stale_after_s`, so a worker that died stops being asked within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import uvicorn

from conveyor.config.settings import ServerConfig
from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.chunk_server import chunk_app
from conveyor.distribution.manifest import MIB
from conveyor.distribution.planner import PlanLimits
from conveyor.distribution.puller import Announcer, ModelPuller, PullSettings
from conveyor.distribution.resolver import PullingResolver, model_cache_dir
from conveyor.fleet.credential import credential_from
from conveyor.observability.metrics import DistributionMetrics
from conveyor.stores import StoreError, open_object_store
from conveyor.stores.model_records import HolderState
from conveyor.stores.protocols import ModelStore

log = logging.getLogger(__name__)
START_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """Where the chunk server listens and how this worker is labelled."""

    worker_id: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    zone: str | None = None
    touch_every_s: float = 1.0
    upload_bytes_s: float | None = None


def pull_settings(settings: PeerSettings) -> PullSettings:
    """This worker's pulls: peers in its zone first, its id as the seed that spreads ties."""
    return PullSettings(limits=PlanLimits(zone=settings.zone, seed=settings.worker_id))


class PeerNode:
    """The chunk server task, the tracker touch task and the resolver that pulls models."""

    def __init__(self, server: uvicorn.Server, resolver: PullingResolver, store: ModelStore):
        """Use `start` instead."""
        self.server = server
        self.resolver = resolver
        self.store = store
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def start(
        cls, config: ServerConfig, store: ModelStore, settings: PeerSettings,
        metrics: DistributionMetrics,
    ) -> PeerNode:  # fmt: skip
        """Serve the cache's chunks, announce them, and return the node."""
        cache = ChunkCache(model_cache_dir(config))
        credential = credential_from(config.fleet)  # asked of peers, and shown to them
        app = chunk_app(cache, metrics, settings.upload_bytes_s, credential=credential)
        uv = uvicorn.Config(
            app, host=settings.host, port=settings.port, lifespan="off", log_level="warning"
        )
        server = uvicorn.Server(uv)
        serving = asyncio.create_task(server.serve(), name="chunk-server")
        while not server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(START_POLL_S)
        if serving.done():
            await serving  # re-raises why it stopped (a port in use)
            raise RuntimeError("the chunk server stopped during start-up")
        port = next(iter(server.servers[0].sockets)).getsockname()[1]
        address = (settings.advertise or f"http://{settings.host}:{port}").rstrip("/")
        announcer = Announcer(settings.worker_id, address, settings.zone)
        objects = open_object_store(config.jobs.object_store_url_for(config.data_dir))
        puller = ModelPuller(
            store, objects, cache, metrics, settings=pull_settings(settings), announcer=announcer,
            credential=credential,
        )  # fmt: skip
        budget = config.model_cache_disk_mb
        node = cls(server, PullingResolver(puller, None if budget is None else budget * MIB), store)
        node._tasks.append(serving)
        await asyncio.to_thread(store.forget_chunks, settings.worker_id)
        await puller.announce(sorted(cache.held_chunks()), HolderState.HAVE)
        touching = asyncio.create_task(node._touch(settings), name="chunk-tracker-touch")
        node._tasks.append(touching)
        log.info("chunk server for %s at %s", settings.worker_id, address)
        return node

    async def _touch(self, settings: PeerSettings) -> None:
        """Keep this worker's holds fresh until cancelled."""
        while True:
            try:
                await asyncio.to_thread(self.store.touch_chunks, settings.worker_id, time.time())
            except StoreError as exc:
                log.warning("chunk tracker touch failed: %s", exc)
            await asyncio.sleep(settings.touch_every_s)

    async def stop(self, worker_id: str) -> None:
        """Stop serving chunks and withdraw this worker's holds."""
        self.server.should_exit = True
        for task in reversed(self._tasks):
            if task.get_name() != "chunk-server":
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(StoreError):
            await asyncio.to_thread(self.store.forget_chunks, worker_id)
