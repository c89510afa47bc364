"""The puller on in-memory stores: origin fallback, resume, bad peers, missing and bad chunks."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.errors import ModelPullFailed, UnknownModel
from conveyor.distribution.manifest import Manifest, chunk_key
from conveyor.distribution.puller import Announcer, ModelPuller, PullSettings
from conveyor.distribution.push import push_model
from conveyor.fakes import MemoryJobStore, MemoryObjectStore
from conveyor.observability.metrics import DistributionMetrics
from conveyor.stores.model_records import HolderState

pytestmark = pytest.mark.anyio
# 10 240 bytes, 10 distinct chunks of 1 KiB.
Pushed = tuple[MemoryJobStore, MemoryObjectStore, Manifest]
WEIGHTS = b"".join(hashlib.sha256(i.to_bytes(2, "big")).digest() for i in range(320))


@pytest.fixture
def pushed(tmp_path: Path) -> Pushed:
    """A model pushed to in-memory stores in 1 KiB chunks."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(WEIGHTS)
    store, objects = MemoryJobStore(), MemoryObjectStore()
    result = push_model(model, "m", store, objects, chunk_bytes=1024, now=1.0)
    return store, objects, result.manifest


def puller_for(
    store: MemoryJobStore,
    objects: MemoryObjectStore,
    root: Path,
    announcer: Announcer | None = None,
) -> tuple[ModelPuller, CollectorRegistry]:
    """A puller into a cache under `root`, with its own metrics registry."""
    registry = CollectorRegistry()
    settings = PullSettings(poll_s=0.01, stall_s=0.05, peer_timeout_s=2.0)
    puller = ModelPuller(
        store, objects, ChunkCache(root), DistributionMetrics(registry), settings=settings,
        announcer=announcer,
    )  # fmt: skip
    return puller, registry


def fetched(registry: CollectorRegistry, source: str) -> float:
    """Bytes fetched from `source` so far."""
    value = registry.get_sample_value("conveyor_model_fetch_bytes_total", {"source": source})
    return value or 0.0


async def test_pull_from_the_origin_builds_the_files(pushed: Pushed, tmp_path: Path) -> None:
    store, objects, manifest = pushed
    me = Announcer("w1", "http://w1")
    puller, registry = puller_for(store, objects, tmp_path / "cache", me)
    directory = await puller.pull("m")
    assert (directory / "weights.bin").read_bytes() == WEIGHTS
    assert fetched(registry, "origin") == len(WEIGHTS)
    holders = store.chunk_holders([c.digest for c in manifest.unique_chunks()])
    assert {h.state for h in holders} == {HolderState.HAVE} and len(holders) == 10
    assert await puller.pull("m") == directory  # assembled: no second fetch
    assert fetched(registry, "origin") == len(WEIGHTS)


async def test_a_pull_resumes_with_the_chunks_already_verified(
    pushed: Pushed, tmp_path: Path
) -> None:
    store, objects, manifest = pushed
    cache = ChunkCache(tmp_path / "cache")
    for chunk in manifest.unique_chunks()[:4]:
        cache.write_chunk(
            chunk.digest, chunk.size_bytes, [objects.objects[chunk_key(chunk.digest)]]
        )
    puller, registry = puller_for(store, objects, tmp_path / "cache")
    await puller.pull("m")
    assert fetched(registry, "origin") == len(WEIGHTS) - 4 * 1024


async def test_unknown_name_is_named(pushed: Pushed, tmp_path: Path) -> None:
    store, objects, _ = pushed
    puller, _ = puller_for(store, objects, tmp_path / "cache")
    with pytest.raises(UnknownModel, match="'nope'"):
        await puller.pull("nope")


async def test_chunk_missing_everywhere_fails_naming_it(pushed: Pushed, tmp_path: Path) -> None:
    store, objects, manifest = pushed
    lost = manifest.unique_chunks()[3].digest
    objects.delete(chunk_key(lost))
    puller, _ = puller_for(store, objects, tmp_path / "cache")
    with pytest.raises(ModelPullFailed, match=lost):
        await puller.pull("m")


async def test_wrong_bytes_at_the_origin_are_never_kept(pushed: Pushed, tmp_path: Path) -> None:
    store, objects, manifest = pushed
    bad = manifest.unique_chunks()[0].digest
    objects.objects[chunk_key(bad)] = b"x" * 1024
    puller, registry = puller_for(store, objects, tmp_path / "cache")
    with pytest.raises(ModelPullFailed, match="keeps failing"):
        await puller.pull("m")
    assert not puller.cache.has_chunk(bad)
    corrupt = registry.get_sample_value("conveyor_model_corrupt_chunks_total", {"source": "origin"})
    assert corrupt is not None and corrupt > 1


async def test_an_unreachable_peer_is_skipped_for_the_origin(
    pushed: Pushed, tmp_path: Path
) -> None:
    store, objects, manifest = pushed
    digests = [c.digest for c in manifest.unique_chunks()]
    store.record_chunks("dead", "http://127.0.0.1:9", None, digests, HolderState.HAVE, time.time())
    puller, registry = puller_for(store, objects, tmp_path / "cache", Announcer("w1", "http://w1"))
    directory = await puller.pull("m")
    assert (directory / "weights.bin").read_bytes() == WEIGHTS
    assert fetched(registry, "peer") == 0 and fetched(registry, "origin") == len(WEIGHTS)


async def test_a_chunk_coming_from_the_origin_elsewhere_is_awaited_then_taken(
    pushed: Pushed, tmp_path: Path
) -> None:
    store, objects, manifest = pushed
    digests = [c.digest for c in manifest.unique_chunks()]
    # Another puller claims every chunk and never delivers: after the stall the puller
    # reads the origin itself.
    store.record_chunks(
        "slow", "http://127.0.0.1:9", None, digests, HolderState.FETCHING, time.time()
    )
    puller, registry = puller_for(store, objects, tmp_path / "cache")
    await puller.pull("m")
    assert fetched(registry, "origin") == len(WEIGHTS)


async def test_a_running_pull_shows_its_bytes_and_drops_them_when_done(
    pushed: Pushed, tmp_path: Path
) -> None:
    store, objects, manifest = pushed
    cache = ChunkCache(tmp_path / "cache")
    for chunk in manifest.unique_chunks()[:4]:
        cache.write_chunk(
            chunk.digest, chunk.size_bytes, [objects.objects[chunk_key(chunk.digest)]]
        )
    puller, registry = puller_for(store, objects, tmp_path / "cache")
    seen: list[tuple[float | None, float | None, float | None]] = []

    async def announce(digests: list[str], state: HolderState = HolderState.HAVE) -> None:
        held = registry.get_sample_value(
            "conveyor_model_pull_bytes", {"model": "m", "state": "held"}
        )
        total = registry.get_sample_value(
            "conveyor_model_pull_bytes", {"model": "m", "state": "total"}
        )
        started = registry.get_sample_value("conveyor_model_pull_started_seconds", {"model": "m"})
        seen.append((held, total, started))

    puller.announce = announce  # type: ignore[method-assign]
    await puller.pull("m")
    helds = [held for held, _, _ in seen]
    assert helds[0] == 4 * 1024 and helds[-1] == len(WEIGHTS)
    assert helds == sorted(helds)
    assert {total for _, total, _ in seen} == {len(WEIGHTS)}
    assert all(started is not None and started > 0 for _, _, started in seen)
    assert (
        registry.get_sample_value("conveyor_model_pull_bytes", {"model": "m", "state": "held"})
        is None
    )
    assert registry.get_sample_value("conveyor_model_pull_started_seconds", {"model": "m"}) is None


async def test_a_chunk_fetched_again_after_corruption_is_not_counted_twice(
    pushed: Pushed, tmp_path: Path
) -> None:
    store, objects, manifest = pushed
    cache = ChunkCache(tmp_path / "cache")
    damaged = manifest.unique_chunks()[0]
    cache.chunk_path(damaged.digest).parent.mkdir(parents=True, exist_ok=True)
    cache.chunk_path(damaged.digest).write_bytes(b"x" * damaged.size_bytes)  # held, but bad
    puller, registry = puller_for(store, objects, tmp_path / "cache")
    helds: list[float | None] = []

    async def announce(digests: list[str], state: HolderState = HolderState.HAVE) -> None:
        labels = {"model": "m", "state": "held"}
        helds.append(registry.get_sample_value("conveyor_model_pull_bytes", labels))

    puller.announce = announce  # type: ignore[method-assign]
    await puller.pull("m")
    assert fetched(registry, "origin") == len(WEIGHTS)  # the bad chunk was fetched again
    assert max(h or 0.0 for h in helds) == len(WEIGHTS)
