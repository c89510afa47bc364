"""Affinity routing, pure: longest cached prefix, the load bound, consistent session hashing."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from conveyor.fleet.affinity import (
    Affinity,
    AffinityReason,
    AffinitySettings,
    PromptKey,
    choose_by_affinity,
    matched_blocks,
    rendezvous_order,
)
from conveyor.fleet.router import Ejections, Router, WorkerView
from conveyor.prefix.hashing import chain_hashes, digest_key
from conveyor.prefix.report import PrefixHoldings

M = "m"
BLOCK = 4
PROMPT = list(range(3, 3 + 41))  # 10 reusable blocks of 4


def holding(num_blocks: int, tokens: list[int] = PROMPT) -> PrefixHoldings:
    """A cache holding the first ``num_blocks`` blocks of ``tokens``."""
    keys = [digest_key(h) for h in chain_hashes(tokens, BLOCK)[:num_blocks]]
    return PrefixHoldings(BLOCK, frozenset(keys))


def view(worker_id: str, blocks: int = 0, *, depth: int = 0) -> WorkerView:
    return WorkerView(
        worker_id=worker_id,
        address=f"http://{worker_id}:1",
        models=frozenset({M}),
        loaded_models=frozenset({M}),
        queue_depth={M: depth},
        last_heartbeat_at=100.0,
        prefixes={M: holding(blocks)} if blocks else {},
    )


def load_of(loads: dict[str, int]):  # type: ignore[no-untyped-def]
    return lambda worker: loads.get(worker.worker_id, 0)


def pick(
    workers: list[WorkerView],
    affinity: Affinity,
    loads: dict[str, int] | None = None,
    bound: int = 4,
) -> tuple[WorkerView, AffinityReason] | None:
    settings = AffinitySettings(load_bound=bound)
    return choose_by_affinity(workers, M, affinity, load_of(loads or {}), settings)


def test_matched_blocks_counts_the_leading_run_only() -> None:
    keys = PromptKey(PROMPT).keys(BLOCK)
    assert matched_blocks(keys, holding(6)) == 6
    assert matched_blocks(keys, None) == 0
    gap = PrefixHoldings(BLOCK, holding(6).keys - {keys[2]})
    assert matched_blocks(keys, gap) == 2  # the engine stops reusing at the first miss


def test_the_longest_matching_prefix_wins() -> None:
    workers = [view("a", 3), view("b", 9), view("c", 5)]
    assert pick(workers, Affinity(PromptKey(PROMPT))) == (workers[1], AffinityReason.PREFIX)


def test_equal_matches_go_to_the_less_loaded() -> None:
    workers = [view("a", 4), view("b", 4)]
    picked = pick(workers, Affinity(PromptKey(PROMPT)), {"a": 3, "b": 1})
    assert picked == (workers[1], AffinityReason.PREFIX)


def test_a_holder_beyond_the_load_bound_loses_to_the_next_longest() -> None:
    workers = [view("a", 9), view("b", 2), view("c")]
    prompt = Affinity(PromptKey(PROMPT))
    # a is 5 busier than the least loaded (c) with a bound of 4: b holds the next longest.
    assert pick(workers, prompt, {"a": 5, "b": 1, "c": 0}) == (workers[1], AffinityReason.PREFIX)
    # At exactly the bound it still wins.
    assert pick(workers, prompt, {"a": 4, "b": 1, "c": 0}) == (workers[0], AffinityReason.PREFIX)
    # Only a holds anything and it is over the bound: no prefix choice, load decides.
    assert pick([workers[0], workers[2]], prompt, {"a": 5, "c": 0}) is None


def test_a_bound_of_zero_only_prefers_among_the_least_loaded() -> None:
    workers = [view("a", 9), view("b", 1)]
    prompt = Affinity(PromptKey(PROMPT))
    assert pick(workers, prompt, {"a": 1, "b": 0}, bound=0) == (workers[1], AffinityReason.PREFIX)


def test_no_match_and_no_session_leaves_the_choice_to_load() -> None:
    other = list(range(500, 541))
    workers = [view("a", 9), view("b", 9)]
    assert pick(workers, Affinity(PromptKey(other))) is None
    assert pick(workers, Affinity()) is None


def test_a_session_without_a_prefix_match_goes_to_its_consistent_worker() -> None:
    workers = [view("a"), view("b"), view("c")]
    affinity = Affinity(PromptKey(list(range(900, 941))), session="s-1")
    first = pick(workers, affinity)
    assert first is not None and first[1] is AffinityReason.SESSION
    assert all(pick(workers, affinity) == first for _ in range(5))
    assert first[0] == rendezvous_order("s-1", workers)[0]


def test_a_prefix_match_beats_the_session() -> None:
    workers = [view("a"), view("b", 2), view("c")]
    picked = pick(workers, Affinity(PromptKey(PROMPT), session="s-1"))
    assert picked == (workers[1], AffinityReason.PREFIX)


def test_a_busy_session_owner_hands_over_to_its_next_choice() -> None:
    workers = [view("a"), view("b"), view("c")]
    order = rendezvous_order("s-9", workers)
    loads = {order[0].worker_id: 10}
    assert pick(workers, Affinity(session="s-9"), loads) == (order[1], AffinityReason.SESSION)


def test_sessions_spread_and_move_little_when_a_worker_leaves() -> None:
    workers = [view(name) for name in "abcd"]
    sessions = [f"session-{i}" for i in range(400)]
    owner = {s: rendezvous_order(s, workers)[0].worker_id for s in sessions}
    assert min(Counter(owner.values()).values()) > 60  # about 100 each
    survivors = [w for w in workers if w.worker_id != "d"]
    moved = [s for s in sessions if rendezvous_order(s, survivors)[0].worker_id != owner[s]]
    # Only the sessions d owned move; every other session keeps its worker.
    assert set(moved) == {s for s in sessions if owner[s] == "d"}


def test_prompt_keys_follow_the_workers_block_size() -> None:
    key = PromptKey(PROMPT)
    assert len(key.keys(4)) == 10
    assert len(key.keys(8)) == 5
    assert len(PromptKey(PROMPT, max_blocks=3).keys(4)) == 3


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="load_bound"):
        AffinitySettings(load_bound=-1)
    with pytest.raises(ValueError, match="max_prompt_blocks"):
        AffinitySettings(max_prompt_blocks=0)


# -- through the router -----------------------------------------------------------------


def router(affinity: AffinitySettings | None = AffinitySettings()) -> Router:  # noqa: B008
    return Router(random.Random(0), Ejections(1.0), affinity=affinity)


def test_the_router_prefers_the_prefix_holder_and_counts_why() -> None:
    workers = [view("a"), view("b", 6), view("c")]
    r = router()
    hint = Affinity(PromptKey(PROMPT))
    assert all(r.choose(workers, M, now=100, affinity=hint) == workers[1] for _ in range(20))
    assert r.num_routed == {"prefix": 20}
    r.choose(workers, M, now=100)
    assert r.num_routed == {"prefix": 20, "load": 1}


def test_the_in_flight_count_enforces_the_bound_through_the_router() -> None:
    workers = [view("a", 6), view("b"), view("c")]
    r = router(AffinitySettings(load_bound=2))
    hint = Affinity(PromptKey(PROMPT))
    chosen = []
    for _ in range(9):
        worker = r.choose(workers, M, now=100, affinity=hint)
        assert worker is not None
        r.acquire(worker.worker_id)
        chosen.append(worker.worker_id)
    loads = [r.in_flight(w) for w in "abc"]
    assert max(loads) - min(loads) <= 2 + 1
    assert chosen[:3] == ["a", "a", "a"]


def test_failover_skips_the_prefix_holder_once_tried() -> None:
    workers = [view("a", 6), view("b"), view("c")]
    worker = router().choose(
        workers, M, now=100, exclude={"a"}, affinity=Affinity(PromptKey(PROMPT))
    )
    assert worker is not None and worker.worker_id != "a"


def test_an_ejected_prefix_holder_gets_nothing() -> None:
    workers = [view("a", 6), view("b")]
    r = router()
    r.ejections.eject("a", now=100)
    assert r.choose(workers, M, now=100.5, affinity=Affinity(PromptKey(PROMPT))) == workers[1]


def test_without_affinity_settings_hints_are_ignored() -> None:
    workers = [view("a", 6, depth=50), view("b")]
    r = router(None)
    assert r.choose(workers, M, now=100, affinity=Affinity(PromptKey(PROMPT))) == workers[1]
    assert r.num_routed == {"load": 1}


def test_equal_matches_and_loads_go_to_the_sessions_worker() -> None:
    workers = [view("a", 4), view("b", 4), view("c", 4)]
    for session in ("s-1", "s-2", "s-3", "s-4"):
        owner = rendezvous_order(session, workers)[0]
        picked = pick(workers, Affinity(PromptKey(PROMPT), session=session))
        assert picked == (owner, AffinityReason.PREFIX)
        # Load comes first: a busier owner loses the tie to an idle holder.
        loads = {w.worker_id: (2 if w is owner else 0) for w in workers}
        busy = pick(workers, Affinity(PromptKey(PROMPT), session=session), loads)
        assert busy is not None and busy[0] is not owner


def session_owned_by(worker_id: str, workers: list[WorkerView]) -> str:
    """A session whose consistent worker among ``workers`` is ``worker_id``."""
    return next(
        session
        for session in (f"s-{index}" for index in range(1000))
        if rendezvous_order(session, workers)[0].worker_id == worker_id
    )


def test_affinity_picks_among_workers_with_the_model_loaded() -> None:
    """A session that hashes to a worker without the model loaded goes to a warm one."""
    cold = WorkerView("cold", "http://cold:1", frozenset({M}), frozenset(), last_heartbeat_at=100)
    workers = [view("warm"), cold]
    session = session_owned_by("cold", workers)
    r = router()
    assert r.choose(workers, M, now=100, affinity=Affinity(session=session)) == workers[0]
    assert r.num_routed == {"session": 1}


def test_with_no_worker_warm_affinity_picks_among_them_all() -> None:
    workers = [
        WorkerView(w, f"http://{w}:1", frozenset({M}), frozenset(), last_heartbeat_at=100)
        for w in ("a", "b", "c")
    ]
    session = session_owned_by("b", workers)
    r = router()
    assert r.choose(workers, M, now=100, affinity=Affinity(session=session)) == workers[1]
    assert r.num_routed == {"session": 1}


def test_the_load_bound_through_the_router_counts_this_gateways_in_flight() -> None:
    """A session's worker this gateway has more requests in flight on than the bound allows
    is passed over for the next worker in the session's order; a large reported depth (every
    running sequence, a heartbeat old) does not pass it over."""
    workers = [view("a", depth=10), view("b")]
    session = session_owned_by("a", workers)
    r = router(AffinitySettings(load_bound=4))
    assert r.choose(workers, M, now=100, affinity=Affinity(session=session)) == workers[0]
    for _ in range(5):
        r.acquire("a")
    assert r.choose(workers, M, now=100, affinity=Affinity(session=session)) == workers[1]
    assert r.num_routed == {"session": 2}
