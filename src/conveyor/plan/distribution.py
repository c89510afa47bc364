"""Getting a model onto a fleet: straight from the origin against peer to peer.

S bytes onto N nodes in racks of R, each rack behind an uplink of B; the origin (an object
store) sends at most O, a node's NIC takes at most L. Each figure is a lower bound:

- direct: every node reads all S from the origin: egress N x S; the origin sends N x S, each
  rack's uplink carries R x S in, each node takes S: the slowest of the three sets the time;
- peer to peer (Conveyor's puller, ``distribution/planner.py``): a chunk comes from the
  origin only when no peer holds it and no other puller is fetching it from there, so the
  origin sends each chunk once (egress S); every rack needs at least one copy in over its
  uplink (cross-rack bytes: at least racks x S). The time is at least the slowest of S over
  O, over B and over L, plus the fill of the pipeline: a chunk passes through about
  log2(N) holders before the last node has it.

The fetch planner takes the rarest chunk first and only then the nearest peer holding it,
so its real cross-rack traffic is above the bound: run round by round through the planner
itself (``tests/unit/plan/p2p_sim.py``), small fleets send exactly S from the origin, about
2 to 4 times racks x S across racks, and take 1.2 to 1.6 times the time bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from conveyor.distribution.manifest import DEFAULT_CHUNK_BYTES

GBIT = 1e9 / 8  # bytes per second in a Gbit/s


@dataclass(frozen=True, slots=True)
class Fleet:
    """The model and the network it crosses (rates in bytes per second)."""

    model_bytes: int
    nodes: int
    rack_size: int
    uplink_bytes_per_s: float
    origin_bytes_per_s: float
    node_bytes_per_s: float
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __post_init__(self) -> None:
        """Reject a fleet the arithmetic cannot use."""
        if min(self.model_bytes, self.nodes, self.rack_size, self.chunk_bytes) < 1:
            raise ValueError("model bytes, nodes, rack size and chunk bytes must be >= 1")
        if min(self.uplink_bytes_per_s, self.origin_bytes_per_s, self.node_bytes_per_s) <= 0:
            raise ValueError("uplink, origin and node rates must be > 0")

    @property
    def racks(self) -> int:
        """Racks the nodes fill."""
        return math.ceil(self.nodes / self.rack_size)


def _slowest(parts: dict[str, float]) -> tuple[float, str]:
    """The largest time and what it is."""
    name = max(parts, key=lambda key: parts[key])
    return parts[name], name


def direct(fleet: Fleet) -> dict[str, Any]:
    """Every node reads the whole model from the origin."""
    size = fleet.model_bytes
    per_rack = min(fleet.rack_size, fleet.nodes)
    seconds, bound = _slowest({
        "origin": fleet.nodes * size / fleet.origin_bytes_per_s,
        "rack uplink": per_rack * size / fleet.uplink_bytes_per_s,
        "node NIC": size / fleet.node_bytes_per_s,
    })  # fmt: skip
    return {"egress_bytes": fleet.nodes * size, "cross_rack_bytes": fleet.nodes * size,
            "seconds": round(seconds, 3), "bound_by": bound}  # fmt: skip


def peer_to_peer(fleet: Fleet) -> dict[str, Any]:
    """Each chunk from the origin about once, into each rack about once, then rack-local."""
    size = fleet.model_bytes
    seconds, bound = _slowest({
        "origin": size / fleet.origin_bytes_per_s,
        "rack uplink": size / fleet.uplink_bytes_per_s,
        "node NIC": size / fleet.node_bytes_per_s,
    })  # fmt: skip
    hops = math.ceil(math.log2(fleet.nodes)) if fleet.nodes > 1 else 0
    fill_s = hops * min(fleet.chunk_bytes, size) / fleet.node_bytes_per_s
    return {"egress_bytes": size, "cross_rack_bytes": fleet.racks * size,
            "seconds": round(seconds + fill_s, 3), "bound_by": bound,
            "pipeline_fill_s": round(fill_s, 3)}  # fmt: skip


def distribution_plan(fleet: Fleet) -> dict[str, Any]:
    """Both ways side by side, and what peer to peer saves."""
    naive, p2p = direct(fleet), peer_to_peer(fleet)
    return {
        "model_bytes": fleet.model_bytes,
        "nodes": fleet.nodes,
        "rack_size": fleet.rack_size,
        "racks": fleet.racks,
        "uplink_gbps": fleet.uplink_bytes_per_s / GBIT,
        "origin_gbps": fleet.origin_bytes_per_s / GBIT,
        "node_gbps": fleet.node_bytes_per_s / GBIT,
        "chunk_bytes": fleet.chunk_bytes,
        "direct": naive,
        "peer_to_peer": p2p,
        "egress_saved_bytes": naive["egress_bytes"] - p2p["egress_bytes"],
        "speedup": round(naive["seconds"] / p2p["seconds"], 2) if p2p["seconds"] else None,
    }
