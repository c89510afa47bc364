"""Chunk planning: rarest first, peer choice with zones and bounds, origin fallback."""

from __future__ import annotations

import pytest

from conveyor.distribution.planner import Fetch, Peer, PlanLimits, PlanState, plan_fetches

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)
P1 = Peer("w1", "http://w1", zone="z1")
P2 = Peer("w2", "http://w2", zone="z2")
P3 = Peer("w3", "http://w3", zone="z2")


def test_rarest_chunk_goes_first() -> None:
    state = PlanState(missing=[A, B], holders={A: [P1, P2], B: [P1]})
    fetches = plan_fetches(state, PlanLimits(max_in_flight=1))
    assert [f.digest for f in fetches] == [B]


def test_chunks_nobody_holds_come_from_the_origin_within_its_bound() -> None:
    state = PlanState(missing=[A, B, C])
    fetches = plan_fetches(state, PlanLimits(max_origin=2))
    assert len(fetches) == 2 and all(f.is_origin for f in fetches)
    busy = PlanState(missing=[A, B, C], origin_load=2)
    assert plan_fetches(busy, PlanLimits(max_origin=2)) == []


def test_same_zone_peer_is_preferred_then_the_least_busy() -> None:
    state = PlanState(missing=[A], holders={A: [P1, P2, P3]}, peer_load={"w2": 1})
    assert plan_fetches(state, PlanLimits(zone="z2")) == [Fetch(A, P3)]
    assert plan_fetches(state, PlanLimits(zone="z1")) == [Fetch(A, P1)]


def test_parallel_fetches_per_peer_are_bounded() -> None:
    state = PlanState(missing=[A, B, C], holders={A: [P1], B: [P1], C: [P1]})
    fetches = plan_fetches(state, PlanLimits(max_per_peer=2))
    assert len(fetches) == 2 and {f.peer for f in fetches} == {P1}
    # A busy peer's chunk waits for it; it is not taken from the origin.
    loaded = PlanState(missing=[A], holders={A: [P1]}, peer_load={"w1": 2})
    assert plan_fetches(loaded, PlanLimits(max_per_peer=2)) == []


def test_a_bad_peer_is_skipped_and_its_only_chunk_falls_back_to_the_origin() -> None:
    state = PlanState(missing=[A, B], holders={A: [P1, P2], B: [P1]}, bad_peers={"w1"})
    fetches = {f.digest: f for f in plan_fetches(state, PlanLimits())}
    assert fetches[A].peer == P2
    assert fetches[B].is_origin


def test_chunk_on_its_way_from_the_origin_elsewhere_is_left_unless_stalled() -> None:
    state = PlanState(missing=[A, B], origin_elsewhere={A})
    assert [f.digest for f in plan_fetches(state, PlanLimits())] == [B]
    state.allow_duplicate_origin = True
    assert {f.digest for f in plan_fetches(state, PlanLimits())} == {A, B}


def test_total_in_flight_is_bounded() -> None:
    state = PlanState(missing=[A, B, C, D], holders={c: [P1, P2] for c in (A, B, C, D)})
    fetches = plan_fetches(state, PlanLimits(max_per_peer=4, max_in_flight=3))
    assert len(fetches) == 3
    state.num_in_flight = 3
    assert plan_fetches(state, PlanLimits(max_in_flight=3)) == []


def test_pullers_with_different_seeds_start_on_different_chunks() -> None:
    missing = [f"{i:064x}" for i in range(64)]
    firsts = {
        plan_fetches(PlanState(missing=missing), PlanLimits(max_origin=1, seed=f"w{i}"))[0].digest
        for i in range(6)
    }
    assert len(firsts) >= 5
    again = plan_fetches(PlanState(missing=missing), PlanLimits(max_origin=1, seed="w0"))
    assert again[0].digest in firsts


def test_limits_must_allow_a_fetch() -> None:
    with pytest.raises(ValueError):
        PlanLimits(max_per_peer=0)


def test_planning_leaves_the_load_it_was_given_as_it_was() -> None:
    load = {"w1": 1}
    state = PlanState(missing=[A, B, C], holders={c: [P1] for c in (A, B, C)}, peer_load=load)
    fetches = plan_fetches(state, PlanLimits(max_per_peer=2))
    assert len(fetches) == 1  # w1 had room for one more
    assert load == {"w1": 1}


def test_a_near_holder_wins_among_many_far_ones_and_far_ones_rank_as_before() -> None:
    far = [Peer(f"f{i}", f"http://f{i}", zone="far") for i in range(50)]
    near = Peer("n", "http://n", zone="z1")
    state = PlanState(missing=[A], holders={A: [*far, near]}, peer_load={"n": 1})
    assert plan_fetches(state, PlanLimits(zone="z1", seed="s")) == [Fetch(A, near)]
    # With no near holder free, the far one is the least busy, then the seed's order.
    state.peer_load = {"n": 2, **{p.worker_id: 1 for p in far[1:]}}
    assert plan_fetches(state, PlanLimits(zone="z1", seed="s")) == [Fetch(A, far[0])]
