"""A model pulled onto a fleet: every node asks the real fetch planner (``plan_fetches``:
rarest first, same rack first, the origin once per chunk) what to fetch, on the virtual
clock.

Links are shared fairly by the transfers crossing them: a chunk moves at the rate of the
tightest link it crosses (the source's NIC, the source rack's uplink out, the origin, the
target rack's uplink in, the target's NIC), each link's bandwidth divided by the transfers
on it when the chunk starts (an approximation of max-min fairness that does not revise a
transfer's rate later). Compared with every node reading the whole model from the origin.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from conveyor.distribution.planner import Fetch, Peer, PlanLimits, PlanState, plan_fetches
from conveyor.plan.distribution import GBIT, Fleet, distribution_plan
from conveyor.sim.clock import Clock
from conveyor.sim.scenario import DistributionSpec


@dataclass(slots=True)
class _Node:
    peer: Peer
    held: set[str] = field(default_factory=set)
    in_flight: set[str] = field(default_factory=set)
    done_at_s: float | None = None


class Pull:
    """Every node pulling every chunk through the planner."""

    def __init__(self, spec: DistributionSpec, seed: int) -> None:
        self.spec, self.clock = spec, Clock()
        self.rng = random.Random(seed)
        n = -(-spec.model_bytes // spec.chunk_bytes)
        self.chunks = [f"c{i:05d}" for i in range(n)]
        self.nodes = [_Node(Peer(f"n{i}", f"http://n{i}", f"r{i // spec.rack_size}"))
                      for i in range(spec.nodes)]  # fmt: skip
        self.holders: dict[str, list[Peer]] = {c: [] for c in self.chunks}
        self.origin_elsewhere: set[str] = set()
        self.load: Counter[str] = Counter()  # transfers per link
        self.peer_load: Counter[str] = Counter()
        self.origin_bytes = 0
        self.cross_rack_bytes = 0
        self.num_plans = 0

    def run(self) -> dict[str, Any]:
        """Pull until every node holds the model; the figures."""
        for node in self.rng.sample(self.nodes, len(self.nodes)):
            self.clock.at(0.0, self._plan, node)
        self.clock.run(float("inf"))
        return self._figures()

    def _plan(self, node: _Node) -> None:
        missing = [c for c in self.chunks if c not in node.held and c not in node.in_flight]
        if not missing:
            return
        limits = PlanLimits(max_in_flight=self.spec.max_in_flight, zone=node.peer.zone,
                            seed=node.peer.worker_id)  # fmt: skip
        state = PlanState(
            missing=missing, holders={c: self.holders[c] for c in missing},
            origin_elsewhere=frozenset(self.origin_elsewhere), peer_load=dict(self.peer_load),
            origin_load=self.load["origin"], num_in_flight=len(node.in_flight),
        )  # fmt: skip
        self.num_plans += 1
        for fetch in plan_fetches(state, limits):
            self._start(node, fetch)
        if not node.in_flight:  # every holder busy: ask again after about a chunk's time
            self.clock.after(self.spec.chunk_bytes / (self.spec.node_gbps * GBIT), self._plan, node)

    def _links(self, node: _Node, fetch: Fetch) -> list[tuple[str, float]]:
        s, gbit = self.spec, GBIT
        links = [(f"nic_in:{node.peer.worker_id}", s.node_gbps * gbit)]
        source_rack = None if fetch.peer is None else fetch.peer.zone
        if fetch.peer is None:
            links.append(("origin", s.origin_gbps * gbit))
        else:
            links.append((f"nic_out:{fetch.peer.worker_id}", s.node_gbps * gbit))
        if source_rack != node.peer.zone:
            links.append((f"up_in:{node.peer.zone}", s.uplink_gbps * gbit))
            if source_rack is not None:
                links.append((f"up_out:{source_rack}", s.uplink_gbps * gbit))
        return links

    def _start(self, node: _Node, fetch: Fetch) -> None:
        links = self._links(node, fetch)
        rate = min(bw / (self.load[name] + 1) for name, bw in links)
        for name, _ in links:
            self.load[name] += 1
        if fetch.peer is None:
            self.origin_elsewhere.add(fetch.digest)
        else:
            self.peer_load[fetch.peer.worker_id] += 1
        node.in_flight.add(fetch.digest)
        size = self.spec.chunk_bytes
        self.clock.after(size / rate, self._arrive, node, fetch, links)

    def _arrive(self, node: _Node, fetch: Fetch, links: list[tuple[str, float]]) -> None:
        size = self.spec.chunk_bytes
        for name, _ in links:
            self.load[name] -= 1
        if fetch.peer is None:
            self.origin_elsewhere.discard(fetch.digest)
            self.origin_bytes += size
        else:
            self.peer_load[fetch.peer.worker_id] -= 1
        if fetch.peer is None or fetch.peer.zone != node.peer.zone:
            self.cross_rack_bytes += size
        node.in_flight.discard(fetch.digest)
        node.held.add(fetch.digest)
        self.holders[fetch.digest].append(node.peer)
        if len(node.held) == len(self.chunks):
            node.done_at_s = self.clock.now
        # Everyone may now have a new source: the receiver, and nodes with a free slot.
        self._plan(node)
        for other in self.rng.sample(self.nodes, min(len(self.nodes), 4)):
            if other.done_at_s is None and len(other.in_flight) < self.spec.max_in_flight:
                self._plan(other)

    def _figures(self) -> dict[str, Any]:
        s = self.spec
        done = [n.done_at_s for n in self.nodes if n.done_at_s is not None]
        size = len(self.chunks) * s.chunk_bytes
        rates = (s.uplink_gbps * GBIT, s.origin_gbps * GBIT, s.node_gbps * GBIT)
        closed = distribution_plan(Fleet(size, s.nodes, s.rack_size, *rates, s.chunk_bytes))
        return {
            "nodes": s.nodes, "nodes_ready": len(done), "chunks": len(self.chunks),
            "chunk_bytes": s.chunk_bytes, "model_bytes": size,
            "all_ready_s": round(max(done), 3) if len(done) == s.nodes else None,
            "median_ready_s": round(sorted(done)[len(done) // 2], 3) if done else None,
            "origin_egress_bytes": self.origin_bytes,
            "origin_egress_models": round(self.origin_bytes / size, 3),
            "cross_rack_bytes": self.cross_rack_bytes, "planner_calls": self.num_plans,
            "events": self.clock.num_events,
            "direct": closed["direct"], "closed_form_peer_to_peer": closed["peer_to_peer"],
        }  # fmt: skip
