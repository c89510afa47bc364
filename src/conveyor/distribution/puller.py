"""Pull a pushed model into the local cache: peers first, the origin as fallback, verified.

`ModelPuller.pull(name)` reads the manifest from the job store, fetches the chunks the cache
lacks (the planner picks which chunk from where; fetches run in threads), announces each
verified chunk in the tracker so that peers can fetch it from here, assembles the files, and
returns the model directory. Chunks already verified on disk are not fetched again, so a pull
killed half-way resumes where it stopped.

Trust: a peer that sends wrong bytes or fails is skipped for the rest of the pull. A chunk
that the origin lacks and no usable peer holds fails the pull, naming the chunk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.errors import CorruptChunk, ModelPullFailed, UnknownModel
from conveyor.distribution.fetch import PeerFailed, fetch_from_origin, fetch_from_peer
from conveyor.distribution.manifest import ChunkRef, Manifest
from conveyor.distribution.planner import Fetch, Peer, PlanLimits, PlanState, plan_fetches
from conveyor.fleet.credential import FleetCredential
from conveyor.observability.metrics import DistributionMetrics
from conveyor.stores.errors import ObjectNotFoundError, ObjectStoreError
from conveyor.stores.model_records import HolderState
from conveyor.stores.object_store import ObjectStore
from conveyor.stores.protocols import ModelStore

log = logging.getLogger(__name__)

MAX_ORIGIN_ERRORS = 5
MAX_ASSEMBLY_TRIES = 3


@dataclass(frozen=True, slots=True)
class Announcer:
    """Who this process is in the tracker: holds are recorded under it when set."""

    worker_id: str
    address: str
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class PullSettings:
    """Bounds and timings of a pull."""

    limits: PlanLimits = field(default_factory=PlanLimits)
    poll_s: float = 0.2
    stall_s: float = 5.0
    stale_after_s: float = 5.0
    peer_timeout_s: float = 30.0


class ModelPuller:
    """Pulls models into one local cache; one pull per model at a time."""

    def __init__(
        self,
        store: ModelStore,
        objects: ObjectStore,
        cache: ChunkCache,
        metrics: DistributionMetrics,
        *,
        settings: PullSettings | None = None,
        announcer: Announcer | None = None,
        credential: FleetCredential | None = None,
    ) -> None:
        """Pull with `store` (manifests, tracker) and `objects` (the origin) into `cache`,
        presenting the fleet key `credential` to peers when the fleet has one."""
        self.store = store
        self.objects = objects
        self.cache = cache
        self.metrics = metrics
        self.settings = settings or PullSettings()
        self.announcer = announcer
        headers = {} if credential is None else {b"authorization": credential.authorization}
        self.http = httpx.Client(timeout=self.settings.peer_timeout_s, headers=headers)

    def close(self) -> None:
        """Release the HTTP connections to peers."""
        self.http.close()

    async def manifest(self, name: str) -> Manifest:
        """The manifest pushed under `name`; UnknownModel when there is none."""
        record = await asyncio.to_thread(self.store.get_manifest, name)
        if record is None:
            raise UnknownModel(
                f"no model named {name!r} has been pushed (see `conveyor models list`)"
            )
        return Manifest.from_json(record.manifest_json)

    async def pull(self, name: str) -> Path:
        """Make the model `name` complete and verified on local disk; return its directory."""
        manifest = await self.manifest(name)
        if self.cache.is_assembled(manifest):
            self.cache.touch(manifest)
            await self.announce([c.digest for c in manifest.unique_chunks()])
            return self.cache.model_dir(manifest)
        started = time.perf_counter()
        self.metrics.pulls_in_progress.inc()
        self._show_progress(manifest)
        try:
            for _ in range(MAX_ASSEMBLY_TRIES):
                await _Pull(self, manifest).run()
                try:
                    directory = await asyncio.to_thread(self.cache.assemble, manifest)
                except CorruptChunk as exc:
                    log.warning("%s: %s; fetching it again", name, exc)
                    await self.forget([exc.digest])
                    continue
                self.metrics.pull_s.labels(model=name).observe(time.perf_counter() - started)
                return directory
            raise ModelPullFailed(f"model {name!r}: local chunks keep failing verification")
        finally:
            self.metrics.pulls_in_progress.dec()
            for state in ("held", "total"):
                self.metrics.pull_bytes.remove(manifest.name, state)
            self.metrics.pull_started.remove(manifest.name)

    def _show_progress(self, manifest: Manifest) -> None:
        """Start the running pull's gauges: bytes needed and start time (``_Pull`` keeps the
        bytes held)."""
        total = sum(c.size_bytes for c in manifest.unique_chunks())
        self.metrics.pull_bytes.labels(manifest.name, "total").set(total)
        self.metrics.pull_started.labels(manifest.name).set(time.time())

    async def announce(self, digests: list[str], state: HolderState = HolderState.HAVE) -> None:
        """Record holds of these chunks in the tracker (when this process serves chunks)."""
        who = self.announcer
        if who is None or not digests:
            return
        await asyncio.to_thread(
            self.store.record_chunks, who.worker_id, who.address, who.zone, digests, state,
            time.time(),
        )  # fmt: skip

    async def forget(self, digests: list[str]) -> None:
        """Withdraw holds of these chunks from the tracker."""
        if self.announcer is not None and digests:
            await asyncio.to_thread(self.store.forget_chunks, self.announcer.worker_id, digests)

    async def holders(self, digests: list[str]) -> tuple[dict[str, list[Peer]], set[str]]:
        """Live peers holding each chunk, and chunks some peer is fetching from the origin."""
        rows = await asyncio.to_thread(self.store.chunk_holders, digests)
        me = self.announcer.worker_id if self.announcer else None
        fresh_after = time.time() - self.settings.stale_after_s
        have: dict[str, list[Peer]] = {}
        coming: set[str] = set()
        for row in rows:
            if row.worker_id == me or row.updated_at < fresh_after:
                continue
            if row.state is HolderState.HAVE:
                have.setdefault(row.digest, []).append(Peer(row.worker_id, row.address, row.zone))
            else:
                coming.add(row.digest)
        return have, coming


class _Pull:
    """One pass of fetching a manifest's missing chunks."""

    def __init__(self, puller: ModelPuller, manifest: Manifest) -> None:
        self.p = puller
        self.name = manifest.name
        self.chunks = {c.digest: c for c in manifest.unique_chunks()}
        self.missing = [d for d in self.chunks if not puller.cache.has_chunk(d)]
        # Set afresh each pass: a chunk deleted as corrupt is fetched (and counted) again.
        held_bytes = sum(c.size_bytes for d, c in self.chunks.items() if d not in self.missing)
        puller.metrics.pull_bytes.labels(self.name, "held").set(held_bytes)
        self.tasks: dict[asyncio.Task[int], Fetch] = {}
        self.bad_peers: set[str] = set()
        self.not_at_origin: set[str] = set()
        self.origin_errors = 0
        self.idle_since = time.monotonic()

    async def run(self) -> None:
        """Fetch until every chunk is held; cancel what is left on failure."""
        held = [d for d in self.chunks if d not in self.missing]
        await self.p.announce(held)
        try:
            while self.missing or self.tasks:
                if self.missing:
                    await self._start_fetches()
                if not self.tasks:
                    await asyncio.sleep(self.p.settings.poll_s)  # waiting for a peer's copy
                    continue
                done, _ = await asyncio.wait(
                    self.tasks, timeout=self.p.settings.poll_s, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    await self._finish(task, self.tasks.pop(task))
        finally:
            for task in self.tasks:
                task.cancel()

    async def _start_fetches(self) -> None:
        """Plan and start the fetches the bounds allow now."""
        have, coming = await self.p.holders(self.missing)
        self._check_sources(have)
        peer_load: dict[str, int] = {}
        for fetch in self.tasks.values():
            if fetch.peer is not None:
                peer_load[fetch.peer.worker_id] = peer_load.get(fetch.peer.worker_id, 0) + 1
        is_stalled = not self.tasks and time.monotonic() - self.idle_since > self.p.settings.stall_s
        state = PlanState(
            missing=[d for d in self.missing if d not in self.not_at_origin or d in have],
            holders=have, origin_elsewhere=coming, peer_load=peer_load,
            origin_load=sum(1 for f in self.tasks.values() if f.is_origin),
            num_in_flight=len(self.tasks), bad_peers=self.bad_peers,
            allow_duplicate_origin=is_stalled,
        )  # fmt: skip
        fetches = plan_fetches(state, self.p.settings.limits)
        origin = [f.digest for f in fetches if f.is_origin]
        await self.p.announce(origin, HolderState.FETCHING)
        for fetch in fetches:
            self.missing.remove(fetch.digest)
            self.tasks[asyncio.create_task(self._fetch(fetch))] = fetch
        if fetches:
            self.idle_since = time.monotonic()

    def _check_sources(self, have: dict[str, list[Peer]]) -> None:
        """Fail when a chunk is neither at the origin nor on any usable peer."""
        for digest in self.not_at_origin & set(self.missing):
            if not any(p.worker_id not in self.bad_peers for p in have.get(digest, ())):
                raise ModelPullFailed(
                    f"model {self.name!r}: chunk {digest} is missing from the object store "
                    "and from every peer"
                )

    async def _fetch(self, fetch: Fetch) -> int:
        """Run one fetch in a thread."""
        chunk: ChunkRef = self.chunks[fetch.digest]
        if fetch.peer is None:
            return await asyncio.to_thread(fetch_from_origin, self.p.objects, self.p.cache, chunk)
        return await asyncio.to_thread(
            fetch_from_peer, self.p.http, fetch.peer, self.p.cache, chunk
        )

    async def _finish(self, task: asyncio.Task[int], fetch: Fetch) -> None:
        """Account for a finished fetch: announce it, or requeue its chunk and blame its source."""
        source = "origin" if fetch.is_origin else "peer"
        try:
            num_bytes = task.result()
        except (CorruptChunk, PeerFailed, ObjectStoreError) as exc:
            self._failed(fetch, exc)
            if fetch.is_origin:
                await self.p.forget([fetch.digest])
            self.missing.append(fetch.digest)
            return
        self.p.metrics.fetch_bytes.labels(source=source).inc(num_bytes)
        self.p.metrics.pull_bytes.labels(self.name, "held").inc(
            self.chunks[fetch.digest].size_bytes
        )
        await self.p.announce([fetch.digest])

    def _failed(self, fetch: Fetch, exc: Exception) -> None:
        """Remember what failed so the planner avoids it."""
        if isinstance(exc, CorruptChunk):
            self.p.metrics.corrupt_chunks.labels(
                source="origin" if fetch.is_origin else "peer"
            ).inc()
        if fetch.peer is not None:
            log.warning("%s: skipping peer %s: %s", self.name, fetch.peer.worker_id, exc)
            self.bad_peers.add(fetch.peer.worker_id)
        elif isinstance(exc, ObjectNotFoundError):
            self.not_at_origin.add(fetch.digest)
        else:
            self.origin_errors += 1
            log.warning("%s: origin fetch of %s failed: %s", self.name, fetch.digest, exc)
            if self.origin_errors > MAX_ORIGIN_ERRORS:
                raise ModelPullFailed(f"model {self.name!r}: the object store keeps failing: {exc}")
