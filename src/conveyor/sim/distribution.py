"""A model pulled onto a fleet: every node asks the real fetch planner (``plan_fetches``:
rarest first, same rack first, the origin once per chunk) what to fetch, on the virtual
clock.

Links are shared fairly by the transfers crossing them: a chunk moves at the rate of the
tightest link it crosses (the source's NIC, the source rack's uplink out, the origin, the
target rack's uplink in, the target's NIC), each link's bandwidth divided by the transfers
on it when the chunk starts (an approximation of max-min fairness that does not revise a
transfer's rate later). Compared with every node reading the whole model from the origin.

What the planner is told: as the real puller tells it, its own fetches per peer and from
the origin (``bounds="own"``: ``max_per_peer`` and ``max_origin`` bound one node's fetches);
``bounds="fleet"`` counts every node's instead (a bound the product does not have, kept to
compare with figures made so).

When a node plans: the real puller asks again every ``poll_s`` and whenever one of its
fetches ends. Here a node plans when one of its fetches ends, and when a fetch ending
elsewhere frees something it could use (``wake="event"``): a new holder of a chunk it lacks;
with fleet-wide bounds also a holder's slot and the origin's. Between those moments its
plan's inputs only grow busier, so asking again would start nothing: the same fetches start
at the same moments as when every node with room asks after every fetch's end
(``wake="poll"``, kept to check this). The real puller's polling every ``poll_s`` starts
such a fetch up to ``poll_s`` later. Chunk sets are bit masks and each chunk keeps the
waiting nodes that lack it, so choosing whom to wake costs a few integer operations.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from conveyor.distribution.planner import Fetch, Peer, PlanLimits, PlanState, plan_fetches
from conveyor.plan.distribution import GBIT, Fleet, distribution_plan
from conveyor.sim.clock import Clock
from conveyor.sim.scenario import DistributionSpec

Wake = Literal["event", "poll"]
Bounds = Literal["own", "fleet"]


@dataclass(slots=True)
class _Node:
    index: int
    peer: Peer
    limits: PlanLimits
    held: int = 0  # chunk bit mask
    busy: int = 0  # chunks in flight
    num_in_flight: int = 0
    wants: int = 0  # what it lacks while it has room for a fetch, else 0
    peer_load: Counter[str] = field(default_factory=Counter)  # its fetches per peer
    done_at_s: float | None = None


def _bits_from(mask: int, start: int) -> Iterator[int]:
    """The set bits of ``mask``, from bit ``start`` up, then from 0 up to ``start``."""
    high = mask >> start << start
    for part in (high, mask ^ high):
        while part:
            low = part & -part
            yield low.bit_length() - 1
            part ^= low


class Pull:
    """Every node pulling every chunk through the planner."""

    def __init__(
        self, spec: DistributionSpec, seed: int, *, wake: Wake = "event", bounds: Bounds = "own"
    ) -> None:
        """Pull ``spec``'s model; ``wake`` says when a node asks the planner, ``bounds`` whose
        fetches the planner's per-peer and origin bounds count (see above)."""
        self.spec, self.clock, self.wake, self.bounds = spec, Clock(), wake, bounds
        self.rng = random.Random(seed)
        n = -(-spec.model_bytes // spec.chunk_bytes)
        self.chunks = [f"c{i:05d}" for i in range(n)]
        self.bit = {c: 1 << i for i, c in enumerate(self.chunks)}
        self.all = (1 << n) - 1
        self.nodes = [self._node(i) for i in range(spec.nodes)]
        self.by_id = {node.peer.worker_id: node for node in self.nodes}
        self.holders: dict[str, list[Peer]] = {c: [] for c in self.chunks}
        self.origin_elsewhere: set[str] = set()
        self.unheld = self.all  # chunks no node holds yet
        self.waiting = 0  # node bit mask: room for a fetch and something to fetch
        self.wanted_by = [0] * n  # per chunk: the waiting nodes that lack it (node bit mask)
        self.load: Counter[str] = Counter()  # transfers per link
        self.peer_load: Counter[str] = Counter()
        self.origin_bytes = 0
        self.cross_rack_bytes = 0
        self.num_plans = 0

    def _node(self, i: int) -> _Node:
        peer = Peer(f"n{i}", f"http://n{i}", f"r{i // self.spec.rack_size}")
        limits = PlanLimits(max_in_flight=self.spec.max_in_flight, zone=peer.zone,
                            seed=peer.worker_id)  # fmt: skip
        return _Node(i, peer, limits)

    def run(self) -> dict[str, Any]:
        """Pull until every node holds the model; the figures."""
        for node in self.rng.sample(self.nodes, len(self.nodes)):
            self.clock.at(0.0, self._plan, node)
        self.clock.run(float("inf"))
        return self._figures()

    def _plan(self, node: _Node) -> None:
        lack = self.all & ~(node.held | node.busy)
        if lack and node.num_in_flight < self.spec.max_in_flight:
            missing = [c for c in self.chunks if lack & self.bit[c]]
            loads = node.peer_load if self.bounds == "own" else self.peer_load
            origin = loads["origin"] if self.bounds == "own" else self.load["origin"]
            state = PlanState(
                missing=missing, holders={c: self.holders[c] for c in missing},
                origin_elsewhere=self.origin_elsewhere, peer_load=loads, origin_load=origin,
                num_in_flight=node.num_in_flight,
            )  # fmt: skip
            self.num_plans += 1
            for fetch in plan_fetches(state, node.limits):
                self._start(node, fetch)
            lack = self.all & ~(node.held | node.busy)
        wants = lack if node.num_in_flight < self.spec.max_in_flight else 0
        if wants != node.wants:
            me = 1 << node.index
            for i in _bits_from(wants ^ node.wants, 0):
                self.wanted_by[i] ^= me
            self.waiting = self.waiting | me if wants else self.waiting & ~me
            node.wants = wants

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
        node.peer_load["origin" if fetch.peer is None else fetch.peer.worker_id] += 1
        node.busy |= self.bit[fetch.digest]
        node.num_in_flight += 1
        size = self.spec.chunk_bytes
        self.clock.after(size / rate, self._arrive, node, fetch, links)

    def _arrive(self, node: _Node, fetch: Fetch, links: list[tuple[str, float]]) -> None:
        size, bit = self.spec.chunk_bytes, self.bit[fetch.digest]
        for name, _ in links:
            self.load[name] -= 1
        if fetch.peer is None:
            self.origin_elsewhere.discard(fetch.digest)
            self.origin_bytes += size
        else:
            self.peer_load[fetch.peer.worker_id] -= 1
        node.peer_load["origin" if fetch.peer is None else fetch.peer.worker_id] -= 1
        if fetch.peer is None or fetch.peer.zone != node.peer.zone:
            self.cross_rack_bytes += size
        node.busy &= ~bit
        node.num_in_flight -= 1
        node.held |= bit
        self.unheld &= ~bit
        self.holders[fetch.digest].append(node.peer)
        if node.held == self.all:
            node.done_at_s = self.clock.now
        self._plan(node)
        self._wake_others(node, fetch)

    def _usable(self, receiver: _Node, fetch: Fetch) -> int:
        """The chunks some waiting node may now start: the one the receiver now holds; with
        fleet-wide bounds also those of the source (a slot of it freed) and those only the
        origin can send (a slot of it freed)."""
        if self.bounds == "own":
            return self.bit[fetch.digest]
        cap = receiver.limits.max_per_peer
        usable = 0
        if fetch.peer is not None and self.peer_load[fetch.peer.worker_id] < cap:
            usable |= self.by_id[fetch.peer.worker_id].held
        if self.peer_load[receiver.peer.worker_id] < cap:
            usable |= self.bit[fetch.digest]
        if self.load["origin"] < receiver.limits.max_origin:
            elsewhere = sum(self.bit[c] for c in self.origin_elsewhere)
            usable |= self.unheld & ~elsewhere
        return usable

    def _wake_others(self, receiver: _Node, fetch: Fetch) -> None:
        """Let the waiting nodes use what this fetch's end freed, in an order drawn afresh
        each time (a fixed order would favour the same nodes)."""
        start = self.rng.randrange(len(self.nodes))
        waiting = self.waiting & ~(1 << receiver.index)
        if self.wake == "poll":
            for i in _bits_from(waiting, start):
                self._plan(self.nodes[i])
            return
        usable = self._usable(receiver, fetch)
        wanting = 0
        for chunk in _bits_from(usable, 0):
            wanting |= self.wanted_by[chunk]
        for i in _bits_from(wanting & waiting, start):
            if not usable:
                return
            node = self.nodes[i]
            if usable & node.wants:
                self._plan(node)
                usable = self._usable(receiver, fetch)

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
            "events": self.clock.num_events, "wake": self.wake,
            "direct": closed["direct"], "closed_form_peer_to_peer": closed["peer_to_peer"],
        }  # fmt: skip
