"""The LRU model cache under a memory budget."""

from __future__ import annotations

import pytest

from conveyor.host.model_cache import CacheFull, ModelCache


def test_models_fit_without_eviction_until_the_budget() -> None:
    cache = ModelCache(budget_bytes=100)
    assert cache.plan_load("a", 60) == []
    cache.add("a", 60)
    assert cache.plan_load("b", 40) == []
    cache.add("b", 40)
    assert cache.used_bytes == 100
    assert cache.is_loaded("a") and cache.is_loaded("b")


def test_least_recently_used_idle_model_is_evicted_first() -> None:
    cache = ModelCache(budget_bytes=100)
    for name in ("a", "b", "c"):
        cache.add(name, 30)
    cache.acquire("a")
    cache.release("a")  # a is now the most recently used
    assert cache.loaded_names == ["b", "c", "a"]
    assert cache.plan_load("d", 40) == ["b"]
    assert cache.plan_load("d", 70) == ["b", "c"]


def test_models_in_use_are_never_evicted() -> None:
    cache = ModelCache(budget_bytes=100)
    cache.add("a", 50)
    cache.add("b", 50)
    cache.acquire("a")
    assert cache.plan_load("c", 50) == ["b"]
    cache.acquire("b")
    with pytest.raises(CacheFull):
        cache.plan_load("c", 50)
    assert not cache.can_load("c", 50)
    cache.release("b")
    assert cache.can_load("c", 50)


def test_a_loaded_model_needs_no_plan() -> None:
    cache = ModelCache(budget_bytes=10)
    cache.add("a", 10)
    assert cache.plan_load("a", 10) == []


def test_a_model_larger_than_the_budget_never_fits() -> None:
    with pytest.raises(CacheFull):
        ModelCache(budget_bytes=10).plan_load("huge", 11)


def test_add_refuses_overcommit_and_duplicates() -> None:
    cache = ModelCache(budget_bytes=10)
    cache.add("a", 6)
    with pytest.raises(CacheFull):
        cache.add("b", 6)
    with pytest.raises(ValueError):
        cache.add("a", 1)


def test_remove_and_release_guard_their_state() -> None:
    cache = ModelCache(budget_bytes=10)
    cache.add("a", 5)
    cache.acquire("a")
    with pytest.raises(ValueError):
        cache.remove("a")
    cache.release("a")
    with pytest.raises(ValueError):
        cache.release("a")
    cache.remove("a")
    assert not cache.is_loaded("a") and cache.used_bytes == 0
    with pytest.raises(KeyError):
        cache.acquire("a")


def test_following_the_plan_makes_room() -> None:
    cache = ModelCache(budget_bytes=100)
    for name, size in (("a", 40), ("b", 30), ("c", 30)):
        cache.add(name, size)
    for victim in cache.plan_load("d", 60):
        cache.remove(victim)
    cache.add("d", 60)
    assert cache.loaded_names == ["c", "d"]


@pytest.mark.parametrize(("budget", "size"), [(0, 1), (10, 0), (10, -1)])
def test_bad_sizes_are_rejected(budget: int, size: int) -> None:
    with pytest.raises(ValueError):
        ModelCache(budget_bytes=budget).plan_load("a", size)
