"""A fleet pulling a model through Conveyor's own fetch planner, in rounds.

Each round every node may receive one chunk (its NIC) and serve one (``max_per_peer`` 1);
the origin serves ``origin_per_round`` chunks a round and each rack's uplink carries
``uplink_per_round`` chunks in and as many out. Nodes ask ``plan_fetches`` what to fetch,
with their rack as their zone, in a seeded order; a fetch the network has no room for this
round waits. What comes out is what the arithmetic of ``plan.distribution`` estimates:
chunks the origin served, chunks that crossed a rack uplink, rounds until every node holds
the model.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from conveyor.distribution.planner import Fetch, Peer, PlanLimits, PlanState, plan_fetches


@dataclass(slots=True)
class Outcome:
    """Chunks served by the origin, chunks across rack uplinks, rounds taken."""

    origin_chunks: int = 0
    cross_rack_chunks: int = 0
    rounds: int = 0


@dataclass(slots=True)
class Round:
    """What the network has already carried this round."""

    origin: int = 0
    origin_digests: set[str] = field(default_factory=set)
    peer_load: Counter[str] = field(default_factory=Counter)
    rack_in: Counter[str] = field(default_factory=Counter)
    rack_out: Counter[str] = field(default_factory=Counter)


def simulate(
    num_nodes: int, rack_size: int, num_chunks: int, origin_per_round: int,
    uplink_per_round: int, seed: int = 0, max_rounds: int = 10_000,
) -> Outcome:  # fmt: skip
    """Rounds of fetches until every node holds every chunk."""
    rng = random.Random(seed)
    nodes = [Peer(f"n{i}", f"http://n{i}", f"r{i // rack_size}") for i in range(num_nodes)]
    chunks = [f"c{i:04d}" for i in range(num_chunks)]
    held: dict[str, set[str]] = {node.worker_id: set() for node in nodes}
    holders: dict[str, list[Peer]] = {digest: [] for digest in chunks}
    outcome = Outcome()
    while any(len(have) < num_chunks for have in held.values()):
        outcome.rounds += 1
        if outcome.rounds > max_rounds:
            raise RuntimeError("the pull does not finish")
        now, arrivals = Round(), []
        for node in rng.sample(nodes, len(nodes)):
            fetch = _next_fetch(node, chunks, held, holders, now, origin_per_round)
            if fetch is not None and _carry(node, fetch, now, uplink_per_round, outcome):
                arrivals.append((node, fetch.digest))
        for node, digest in arrivals:
            held[node.worker_id].add(digest)
            holders[digest].append(node)
    return outcome


def _next_fetch(
    node: Peer, chunks: list[str], held: dict[str, set[str]], holders: dict[str, list[Peer]],
    now: Round, origin_per_round: int,
) -> Fetch | None:  # fmt: skip
    """What the planner has this node fetch now (at most one chunk a round)."""
    missing = [digest for digest in chunks if digest not in held[node.worker_id]]
    if not missing:
        return None
    limits = PlanLimits(max_per_peer=1, max_origin=1, max_in_flight=1, zone=node.zone,
                        seed=node.worker_id)  # fmt: skip
    state = PlanState(
        missing=missing, holders={d: holders[d] for d in missing},
        origin_elsewhere=frozenset(now.origin_digests), peer_load=dict(now.peer_load),
        origin_load=0 if now.origin < origin_per_round else limits.max_origin,
    )  # fmt: skip
    fetches = plan_fetches(state, limits)
    return fetches[0] if fetches else None


def _carry(node: Peer, fetch: Fetch, now: Round, uplink: int, outcome: Outcome) -> bool:
    """Whether the network has room for the fetch this round; counts it if so."""
    zone = str(node.zone)
    if fetch.peer is None:
        if now.rack_in[zone] >= uplink:
            return False
        now.origin += 1
        now.origin_digests.add(fetch.digest)
        outcome.origin_chunks += 1
    else:
        source = str(fetch.peer.zone)
        if source != zone:
            if now.rack_in[zone] >= uplink or now.rack_out[source] >= uplink:
                return False
            now.rack_out[source] += 1
        now.peer_load[fetch.peer.worker_id] += 1
    if fetch.peer is None or fetch.peer.zone != node.zone:
        now.rack_in[zone] += 1
        outcome.cross_rack_chunks += 1
    return True
