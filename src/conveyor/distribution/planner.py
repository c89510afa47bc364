"""Which chunk to fetch next, and from where: rarest first, peers before the origin.

Pure: the puller hands in what it knows (chunks still missing, who holds what, how busy each
source is) and gets back the fetches to start now. The rules:

- rarest first: chunks held by the fewest peers go first, so rare chunks spread before the
  peers holding them leave; ties are broken by a hash of the puller's seed, so pullers that
  start together fetch different chunks from the origin instead of the same ones;
- a chunk some peer holds comes from a peer: the same zone first, then the least busy, never
  one that served wrong bytes during this pull, at most `max_per_peer` fetches on each;
- a chunk no usable peer holds comes from the origin (at most `max_origin` at once), unless
  another puller is already fetching it from the origin: then it is left for later, when it
  will be on a peer; `allow_duplicate_origin` lifts that when waiting has stalled.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Peer:
    """A worker that serves chunks: its id, the URL of its chunk server, its zone label."""

    worker_id: str
    address: str
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class Fetch:
    """One chunk to fetch, from a peer or (`peer` None) from the origin."""

    digest: str
    peer: Peer | None

    @property
    def is_origin(self) -> bool:
        """Whether this fetch reads the object store."""
        return self.peer is None


@dataclass(frozen=True, slots=True)
class PlanLimits:
    """How much a puller may have in flight, and its place in the fleet."""

    max_per_peer: int = 2
    max_origin: int = 2
    max_in_flight: int = 8
    zone: str | None = None
    seed: str = ""

    def __post_init__(self) -> None:
        """Every bound must allow at least one fetch."""
        if min(self.max_per_peer, self.max_origin, self.max_in_flight) < 1:
            raise ValueError("max_per_peer, max_origin and max_in_flight must be >= 1")


@dataclass(slots=True)
class PlanState:
    """What the puller knows now.

    `missing`: chunks not held and not in flight, in manifest order; `holders`: the peers
    holding each chunk verified; `origin_elsewhere`: chunks another puller is fetching from
    the origin now; `peer_load`: fetches in flight per peer id; `bad_peers`: peer ids that
    served wrong bytes or failed during this pull.
    """

    missing: Sequence[str]
    holders: Mapping[str, Sequence[Peer]] = field(default_factory=dict)
    origin_elsewhere: Set[str] = frozenset()
    peer_load: Mapping[str, int] = field(default_factory=dict)
    origin_load: int = 0
    num_in_flight: int = 0
    bad_peers: Set[str] = frozenset()
    allow_duplicate_origin: bool = False


def plan_fetches(state: PlanState, limits: PlanLimits) -> list[Fetch]:
    """The fetches to start now, within every bound (possibly none)."""
    peer_load = dict(state.peer_load)
    origin_load = state.origin_load
    room = limits.max_in_flight - state.num_in_flight
    fetches: list[Fetch] = []
    bad = state.bad_peers
    for digest in rarest_first(state, limits.seed):
        if room <= 0:
            break
        holders = state.holders.get(digest, ())
        usable = [p for p in holders if p.worker_id not in bad] if bad else holders
        if usable:
            peer = choose_peer(usable, peer_load, limits)
            if peer is None:
                continue  # every holder is busy: a slot frees soon
            peer_load[peer.worker_id] = peer_load.get(peer.worker_id, 0) + 1
            fetches.append(Fetch(digest, peer))
        elif origin_load < limits.max_origin and _may_use_origin(digest, state):
            origin_load += 1
            fetches.append(Fetch(digest, None))
        else:
            continue
        room -= 1
    return fetches


def rarest_first(state: PlanState, seed: str) -> list[str]:
    """The missing chunks, fewest usable holders first, ties in the seed's own order."""

    bad = state.bad_peers

    def rarity(digest: str) -> tuple[int, str]:
        holders = state.holders.get(digest, ())
        num_usable = sum(1 for p in holders if p.worker_id not in bad) if bad else len(holders)
        return num_usable, _spread(seed, digest)

    return sorted(state.missing, key=rarity)


def choose_peer(
    peers: Sequence[Peer], peer_load: Mapping[str, int], limits: PlanLimits
) -> Peer | None:
    """The peer to ask: under its bound, same zone first, least busy, then the seed's order."""
    free = [p for p in peers if peer_load.get(p.worker_id, 0) < limits.max_per_peer]
    if not free:
        return None

    def preference(peer: Peer) -> tuple[bool, int, str]:
        is_far = limits.zone is None or peer.zone != limits.zone
        return is_far, peer_load.get(peer.worker_id, 0), _spread(limits.seed, peer.worker_id)

    # A free peer of the same zone beats every far one: rank those alone when there are any
    # (each rank hashes the peer's id, and a chunk may have thousands of far holders).
    near = [p for p in free if p.zone == limits.zone] if limits.zone is not None else []
    return min(near or free, key=preference)


def _may_use_origin(digest: str, state: PlanState) -> bool:
    """Whether to read this chunk from the origin rather than wait for another puller's copy."""
    return state.allow_duplicate_origin or digest not in state.origin_elsewhere


# A puller ranks the same chunks and peers by the same hashes at every plan (a plan a
# finished fetch, a few hundred for a large model): each is computed once.
SPREAD_CACHE_SIZE = 2**18


@functools.lru_cache(maxsize=SPREAD_CACHE_SIZE)
def _spread(seed: str, key: str) -> str:
    """A stable per-puller order: pullers with different seeds order keys differently."""
    return hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).hexdigest()
