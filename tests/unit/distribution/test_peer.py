"""A worker's pulls carry its zone and id into the planner."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from conveyor.config import load_config
from conveyor.distribution.peer import PeerNode, PeerSettings, pull_settings
from conveyor.distribution.planner import Peer, PlanState, choose_peer, rarest_first
from conveyor.fakes import MemoryJobStore
from conveyor.metrics import DistributionMetrics


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
