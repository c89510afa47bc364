"""A worker's pulls carry its zone and id into the planner."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from conveyor.config.settings import ServerConfig, load_config
from conveyor.distribution.peer import PeerNode, PeerSettings, pull_settings
from conveyor.distribution.planner import Peer, PlanState, choose_peer, rarest_first
from conveyor.distribution.push import push_model
from conveyor.fakes import MemoryJobStore
from conveyor.observability.metrics import DistributionMetrics
from conveyor.stores import open_object_store


def test_a_worker_prefers_peers_in_its_own_zone() -> None:
    limits = pull_settings(PeerSettings(worker_id="w1", zone="eu-1")).limits
    far, near = Peer("a", "http://a", "us-1"), Peer("b", "http://b", "eu-1")
    assert choose_peer([far, near], {}, limits) == near


def test_workers_order_equally_rare_chunks_differently() -> None:
    state = PlanState(missing=[f"{i:064x}" for i in range(16)])
    orders = {
        tuple(rarest_first(state, pull_settings(PeerSettings(worker_id=w)).limits.seed))
        for w in ("w1", "w2", "w3")
    }
    assert len(orders) == 3  # so pullers starting together ask the origin for different chunks


@pytest.mark.anyio
async def test_a_started_node_pulls_with_its_zone_and_seed(tmp_path: Path) -> None:
    config = load_config(overrides={"data_dir": str(tmp_path)}, env={})
    settings = PeerSettings(worker_id="w1", zone="eu-1")
    metrics = DistributionMetrics(CollectorRegistry())
    node = await PeerNode.start(config, MemoryJobStore(), settings, metrics)
    try:
        limits = node.resolver.puller.settings.limits
        assert (limits.zone, limits.seed) == ("eu-1", "w1")
    finally:
        await node.stop("w1")


FLEET_KEY = "fleet-key-0123456789abcdef"


def peer_config(tmp_path: Path, name: str, fleet_key: str) -> ServerConfig:
    """A worker's config: its own cache, the shared origin, the given fleet key."""
    return load_config(
        overrides={
            "data_dir": str(tmp_path / name),
            "jobs": {"object_store_url": str(tmp_path / "objects")},
            "fleet": {"internal_key": fleet_key},
        },
        env={},
    )


def fetched_from(metrics: CollectorRegistry, source: str) -> float:
    value = metrics.get_sample_value("conveyor_model_fetch_bytes_total", {"source": source})
    return value or 0.0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("key", "source"), [(FLEET_KEY, "peer"), ("another-key-0123456789", "origin")]
)
async def test_peers_present_the_fleet_key_to_each_other_s_chunk_servers(
    tmp_path: Path, key: str, source: str
) -> None:
    store = MemoryJobStore()
    model = tmp_path / "model"
    model.mkdir()
    distinct = b"".join(hashlib.sha256(i.to_bytes(2, "big")).digest() for i in range(128))
    (model / "weights.bin").write_bytes(distinct)  # four distinct chunks
    objects = open_object_store(str(tmp_path / "objects"))
    manifest = push_model(model, "m", store, objects, chunk_bytes=1024, now=1.0).manifest
    seed = await PeerNode.start(
        peer_config(tmp_path, "a", FLEET_KEY), store, PeerSettings(worker_id="a"),
        DistributionMetrics(CollectorRegistry()),
    )  # fmt: skip
    registry = CollectorRegistry()
    puller = await PeerNode.start(
        peer_config(tmp_path, "b", key), store, PeerSettings(worker_id="b"),
        DistributionMetrics(registry),
    )  # fmt: skip
    try:
        await seed.resolver.puller.pull("m")  # from the origin: no peer holds it yet
        await puller.resolver.puller.pull("m")
    finally:
        await puller.stop("b")
        await seed.stop("a")
    # With the fleet's key, all from the seed; with another, the seed refuses (401) and the
    # puller falls back to the origin.
    assert fetched_from(registry, source) == manifest.total_bytes
