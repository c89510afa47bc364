"""Model distribution arithmetic: straight from the origin against peer to peer, checked by
hand and against Conveyor's own fetch planner run round by round."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.plan.distribution import GBIT, Fleet, direct, distribution_plan, peer_to_peer
from tests.unit.plan.p2p_sim import simulate

GB, MIB = 10**9, 2**20


def test_200_gb_onto_10000_nodes_straight_from_the_origin_is_2_pb_of_egress() -> None:
    fleet = Fleet(200 * GB, 10_000, 32, 100 * GBIT, 100 * GBIT, 100 * GBIT)
    plan = distribution_plan(fleet)
    assert plan["racks"] == 313
    assert plan["direct"]["egress_bytes"] == 2 * 10**15
    # 2 PB through 12.5 GB/s of origin: 160,000 s; the origin, not a rack, is the limit.
    assert plan["direct"]["seconds"] == 160_000 and plan["direct"]["bound_by"] == "origin"
    p2p = plan["peer_to_peer"]
    assert p2p["egress_bytes"] == 200 * GB and p2p["cross_rack_bytes"] == 313 * 200 * GB
    fill = 14 * 64 * MIB / (100 * GBIT)  # log2(10,000) -> 14 hops of one 64 MiB chunk
    assert p2p["seconds"] == pytest.approx(16 + fill, abs=1e-3)
    assert plan["egress_saved_bytes"] == 2 * 10**15 - 200 * GB


def test_the_slowest_link_bounds_each_way() -> None:
    fleet = Fleet(10 * GB, 64, 16, 10 * GBIT, 400 * GBIT, 100 * GBIT)
    # Direct: 16 nodes x 10 GB through a 1.25 GB/s uplink (128 s) beats 640 GB / 50 GB/s.
    assert direct(fleet)["bound_by"] == "rack uplink" and direct(fleet)["seconds"] == 128
    assert peer_to_peer(fleet)["bound_by"] == "rack uplink"
    with pytest.raises(ValueError):
        Fleet(1, 0, 1, 1, 1, 1)


@pytest.mark.parametrize(
    ("nodes", "rack", "chunks", "origin", "uplink"),
    [(24, 8, 16, 2, 2), (48, 8, 32, 4, 2), (64, 16, 32, 2, 4), (12, 4, 20, 1, 1)],
)
def test_the_real_fetch_planner_keeps_within_the_arithmetic(
    nodes: int, rack: int, chunks: int, origin: int, uplink: int
) -> None:
    # A round moves one chunk over a node's NIC: rates in chunks a round, 1 MiB chunks.
    node_rate = float(MIB)
    fleet = Fleet(chunks * MIB, nodes, rack, uplink * node_rate, origin * node_rate,
                  node_rate, chunk_bytes=MIB)  # fmt: skip
    bound = peer_to_peer(fleet)
    pulled = simulate(nodes, rack, chunks, origin, uplink)
    # The planner never fetches a chunk from the origin twice: egress is the model, once.
    assert pulled.origin_chunks * MIB == bound["egress_bytes"]
    assert pulled.cross_rack_chunks * MIB >= bound["cross_rack_bytes"]
    assert bound["seconds"] <= pulled.rounds <= 2 * bound["seconds"]
    # Direct, each node would read the whole model from the origin.
    assert direct(fleet)["egress_bytes"] == nodes * chunks * MIB
    assert math.ceil(nodes / rack) == fleet.racks


def test_plan_prints_the_distribution_alone_or_beside_a_capacity_plan() -> None:
    result = CliRunner().invoke(app, ["plan", "--model-bytes", str(200 * GB), "--nodes", "10000"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("distribution: 200.00 GB onto 10,000 nodes (313 racks of 32")
    assert "egress 2.00 PB" in lines[1] and "egress 200.00 GB" in lines[2]
    refused = CliRunner().invoke(app, ["plan", "--nodes", "10"])
    assert refused.exit_code == 2 and "--model-bytes" in refused.stderr
