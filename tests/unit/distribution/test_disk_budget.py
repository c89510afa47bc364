"""The local disk budget: LRU eviction that never touches pinned models."""

from __future__ import annotations

import pytest

from conveyor.distribution.disk_budget import (
    CachedModel,
    DiskBudgetExceeded,
    plan_disk_eviction,
    used_bytes,
)

SIZES = {"c1": 10, "c2": 10, "c3": 10}


def model(key: str, chunks: set[str], last_used_s: float, *, pinned: bool = False) -> CachedModel:
    """A cached model whose assembled files take as much as its chunks."""
    return CachedModel(key, 10 * len(chunks), frozenset(chunks), last_used_s, pinned)


def test_shared_chunks_count_once() -> None:
    models = [model("a", {"c1", "c2"}, 1), model("b", {"c2"}, 2)]
    assert used_bytes(models, SIZES) == 30 + 20


def test_least_recently_used_goes_first_and_only_as_much_as_needed() -> None:
    models = [model("new", {"c1"}, 5), model("old", {"c2"}, 1), model("mid", {"c3"}, 3)]
    assert plan_disk_eviction(models, SIZES, budget_bytes=60, incoming_bytes=0) == []
    assert plan_disk_eviction(models, SIZES, budget_bytes=60, incoming_bytes=20) == ["old"]
    assert plan_disk_eviction(models, SIZES, budget_bytes=60, incoming_bytes=40) == ["old", "mid"]


def test_pinned_models_are_never_evicted() -> None:
    models = [model("old", {"c1"}, 1, pinned=True), model("new", {"c2"}, 2)]
    assert plan_disk_eviction(models, SIZES, budget_bytes=40, incoming_bytes=20) == ["new"]
    with pytest.raises(DiskBudgetExceeded):
        plan_disk_eviction(models, SIZES, budget_bytes=40, incoming_bytes=30)


def test_a_chunk_shared_with_a_kept_model_frees_nothing() -> None:
    models = [model("keep", {"c1"}, 9, pinned=True), model("share", {"c1"}, 1)]
    # Evicting "share" frees its 10 assembled bytes; c1 stays for "keep".
    assert plan_disk_eviction(models, SIZES, budget_bytes=30, incoming_bytes=10) == ["share"]
