"""Routing: health filters, passive ejection, power of two choices, warm-model preference."""

from __future__ import annotations

import itertools
import random

import pytest

from conveyor.fleet.router import Ejections, Router, RoutingPolicy, WorkerView

M = "m"


def view(
    worker_id: str,
    *,
    depth: int = 0,
    models: tuple[str, ...] = (M,),
    loaded: tuple[str, ...] | None = None,
    heartbeat_at: float = 100.0,
    is_stale: bool = False,
    is_draining: bool = False,
) -> WorkerView:
    return WorkerView(
        worker_id=worker_id,
        address=f"http://{worker_id}:1",
        models=frozenset(models),
        loaded_models=frozenset(models if loaded is None else loaded),
        queue_depth={model: depth for model in models},
        last_heartbeat_at=heartbeat_at,
        is_stale=is_stale,
        is_draining=is_draining,
    )


def router(seed: int = 0, cooldown_s: float = 1.0, cold_penalty: int = 8) -> Router:
    return Router(random.Random(seed), Ejections(cooldown_s), RoutingPolicy(cold_penalty))


def test_no_worker_means_none() -> None:
    assert router().choose([], M, now=100) is None


def test_only_workers_hosting_the_model_are_candidates() -> None:
    workers = [view("a", models=("x",)), view("b")]
    assert router().choose(workers, M, now=100) == workers[1]
    assert router().choose(workers, "unknown", now=100) is None


@pytest.mark.parametrize("flag", ["is_stale", "is_draining"])
def test_stale_or_draining_workers_get_nothing(flag: str) -> None:
    bad = view("a", is_stale=True) if flag == "is_stale" else view("a", is_draining=True)
    workers = [bad, view("b", depth=1000)]
    r = router()
    assert all(r.choose(workers, M, now=100).worker_id == "b" for _ in range(50))  # type: ignore[union-attr]
    assert router().choose([workers[0]], M, now=100) is None


def test_excluded_workers_are_skipped() -> None:
    workers = [view("a"), view("b")]
    assert router().choose(workers, M, now=100, exclude={"a"}) == workers[1]
    assert router().choose(workers, M, now=100, exclude={"a", "b"}) is None


def test_the_less_loaded_of_two_wins() -> None:
    workers = [view("a", depth=5), view("b", depth=1)]
    for seed in range(20):
        assert router(seed).choose(workers, M, now=100) == workers[1]


def test_the_most_loaded_worker_is_never_chosen() -> None:
    workers = [view(f"w{i}", depth=i) for i in range(5)]
    r = router(seed=3)
    chosen = {r.choose(workers, M, now=100).worker_id for _ in range(500)}  # type: ignore[union-attr]
    assert "w4" not in chosen
    assert chosen == {"w0", "w1", "w2", "w3"}


def test_load_counts_this_gateways_in_flight_plus_reported_depth() -> None:
    a, b = view("a", depth=2), view("b", depth=0)
    r = router()
    for _ in range(3):
        r.acquire("b")
    assert r.load(b, M) == 3 and r.load(a, M) == 2
    assert r.choose([a, b], M, now=100) == a
    r.release("b")
    r.release("b")
    assert r.in_flight("b") == 1
    assert r.choose([a, b], M, now=100) == b
    r.release("b")
    r.release("b")  # an extra release never goes negative
    assert r.in_flight("b") == 0


def test_ties_spread_over_workers() -> None:
    workers = [view(f"w{i}") for i in range(3)]
    r = router(seed=1)
    chosen = {r.choose(workers, M, now=100).worker_id for _ in range(200)}  # type: ignore[union-attr]
    assert chosen == {"w0", "w1", "w2"}


def test_ejected_worker_returns_after_cooldown_and_a_new_heartbeat() -> None:
    r = router(cooldown_s=1.0)
    r.ejections.eject("a", now=100.0)
    old = view("a", heartbeat_at=99.5)
    assert r.choose([old], M, now=100.5) is None  # cooling down
    assert r.choose([old], M, now=102.0) is None  # cooled, but no heartbeat since
    fresh = view("a", heartbeat_at=100.2)
    assert r.choose([fresh], M, now=100.9) is None  # heartbeat, but still cooling
    assert r.choose([fresh], M, now=101.0) == fresh
    assert not r.ejections.is_ejected(fresh, now=101.0)


def test_ejections_of_vanished_workers_are_forgotten() -> None:
    ejections = Ejections(cooldown_s=1.0)
    ejections.eject("a", now=10)
    ejections.eject("b", now=10)
    ejections.forget_missing({"b"})
    assert not ejections.is_ejected(view("a", heartbeat_at=0), now=10)
    assert ejections.is_ejected(view("b", heartbeat_at=0), now=10)


def test_warm_workers_are_preferred_while_not_busy() -> None:
    warm = view("warm", depth=5)
    cold = view("cold", depth=0, loaded=())
    for seed in range(20):
        assert router(seed, cold_penalty=8).choose([warm, cold], M, now=100) == warm


def test_a_busy_warm_worker_spills_to_a_cold_one() -> None:
    warm = view("warm", depth=20)
    cold = view("cold", depth=0, loaded=())
    assert router(cold_penalty=8).choose([warm, cold], M, now=100) == cold


def test_a_cold_worker_must_beat_warm_load_by_the_penalty() -> None:
    warm = view("warm", depth=10)
    cold = view("cold", depth=3, loaded=())
    assert router(cold_penalty=8).choose([warm, cold], M, now=100) == warm  # 3 + 8 > 10
    cold_idle = view("cold", depth=1, loaded=())
    assert router(cold_penalty=8).choose([warm, cold_idle], M, now=100) == cold_idle


def test_without_warm_workers_cold_ones_compete_on_load() -> None:
    workers = [view("c1", depth=4, loaded=()), view("c2", depth=1, loaded=())]
    for seed in range(10):
        assert router(seed).choose(workers, M, now=100) == workers[1]


def test_every_combination_of_flags_is_filtered() -> None:
    for is_stale, is_draining, is_ejected in itertools.product([False, True], repeat=3):
        r = router()
        worker = view("a", is_stale=is_stale, is_draining=is_draining, heartbeat_at=50)
        if is_ejected:
            r.ejections.eject("a", now=99)
        is_ok = not (is_stale or is_draining or is_ejected)
        assert (r.choose([worker], M, now=100) is not None) is is_ok


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError):
        WorkerView("", "http://x", frozenset({M}), frozenset())
    with pytest.raises(ValueError):
        WorkerView("a", "http://x", frozenset({M}), frozenset({"other"}))
    with pytest.raises(ValueError):
        Ejections(cooldown_s=-1)
    with pytest.raises(ValueError):
        RoutingPolicy(cold_penalty=-1)


def test_a_heartbeat_at_the_ejection_instant_does_not_readmit() -> None:
    """Only a heartbeat sent after the ejection proves the worker came back."""
    r = router(cooldown_s=1.0)
    r.ejections.eject("a", now=100.0)
    same_instant = view("a", heartbeat_at=100.0)
    assert r.choose([same_instant], M, now=105.0) is None
    assert r.ejections.is_ejected(same_instant, now=105.0)
    later = view("a", heartbeat_at=100.001)
    assert r.choose([later], M, now=105.0) == later


def test_readmission_starts_exactly_when_the_cooldown_ends() -> None:
    """The cooldown is a closed bound: at ``ejected_at + cooldown_s`` the worker is back."""
    r = router(cooldown_s=2.0)
    r.ejections.eject("a", now=10.0)
    fresh = view("a", heartbeat_at=11.0)
    assert r.ejections.is_ejected(fresh, now=11.999)
    assert not r.ejections.is_ejected(fresh, now=12.0)


def test_a_zero_cooldown_readmits_on_the_next_heartbeat() -> None:
    """With no cooldown, the first heartbeat after the ejection is enough."""
    r = router(cooldown_s=0.0)
    r.ejections.eject("a", now=10.0)
    assert r.ejections.is_ejected(view("a", heartbeat_at=10.0), now=10.0)
    assert not r.ejections.is_ejected(view("a", heartbeat_at=10.5), now=10.5)


def test_a_cold_worker_that_only_ties_with_the_warm_one_loses() -> None:
    """Loading a model costs something real, so a tie after the penalty goes to the warm worker."""
    warm = view("warm", depth=11)
    tied = view("cold", depth=3, loaded=())  # 3 + 8 == 11
    assert router(cold_penalty=8).choose([warm, tied], M, now=100) == warm
    better = view("cold", depth=2, loaded=())  # 2 + 8 < 11
    assert router(cold_penalty=8).choose([warm, better], M, now=100) == better


def test_two_choices_tie_keeps_the_first_drawn() -> None:
    """Between two equally loaded workers the first one drawn wins, so ties spread by the draw."""
    workers = [view("a", depth=2), view("b", depth=2)]
    for seed in range(10):
        first, _ = random.Random(seed).sample(workers, 2)
        assert router(seed).choose(workers, M, now=100) == first


def test_a_worker_that_reports_no_depth_for_the_model_counts_as_idle() -> None:
    worker = WorkerView("a", "http://a:1", frozenset({M}), frozenset({M}), queue_depth={})
    assert router().load(worker, M) == 0


def test_defaults_and_a_zero_penalty_are_valid() -> None:
    assert Router(random.Random(0), Ejections(1.0)).policy == RoutingPolicy()
    assert RoutingPolicy(cold_penalty=0).cold_penalty == 0


def test_a_new_views_list_replaces_the_remembered_pools() -> None:
    r = router()
    first = [view("a"), view("b")]
    assert {r.choose(first, M, now=100).worker_id for _ in range(40)} == {"a", "b"}  # type: ignore[union-attr]
    refreshed = [view("a", is_stale=True), view("b")]
    assert {r.choose(refreshed, M, now=100).worker_id for _ in range(40)} == {"b"}  # type: ignore[union-attr]
    assert r.candidates(refreshed, M, now=100) == [refreshed[1]]


def test_candidates_keep_the_registry_order_across_warm_and_cold() -> None:
    workers = [view("a", loaded=()), view("b"), view("c", loaded=())]
    assert [w.worker_id for w in router().candidates(workers, M, now=100)] == ["a", "b", "c"]
