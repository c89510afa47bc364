"""The simulation's store: the product's in-memory store, an outage switch, and one read's
rows and views shared by the gateways reading at the same instant."""

from __future__ import annotations

import pytest

from conveyor.fleet.registry import view_from_record
from conveyor.sim.store import SimStore
from conveyor.stores.errors import StoreError


def beat(store: SimStore, worker_id: str, depth: int, now: float) -> None:
    load = {"models": {"m": {"queue_depth": depth}}}
    store.upsert_worker(worker_id, f"http://{worker_id}:1", ["m"], 1, load, now)


def test_reads_at_one_instant_share_rows_and_views_until_a_row_is_written() -> None:
    store = SimStore()
    beat(store, "w1", 1, 0.0)
    beat(store, "w2", 2, 0.0)
    first, second = store.list_workers(1.0, 5.0), store.list_workers(1.0, 5.0)
    assert first == second and first is not second  # each caller gets its own list
    assert all(a is b for a, b in zip(first, second, strict=True))
    views = [store.view_of(r) for r in first]
    assert views == [view_from_record(r) for r in first]
    assert all(store.view_of(r) is v for r, v in zip(second, views, strict=True))
    later = store.list_workers(2.0, 5.0)  # another instant: aged again
    assert [r.heartbeat_age_s for r in later] == [2.0, 2.0]
    beat(store, "w1", 7, 2.0)  # a write: read again
    (w1, _) = store.list_workers(2.0, 5.0)
    assert store.view_of(w1).queue_depth == {"m": 7}
    assert store.remove_worker("w2")
    assert [r.worker_id for r in store.list_workers(2.0, 5.0)] == ["w1"]


def test_an_outage_fails_every_call() -> None:
    store = SimStore()
    beat(store, "w1", 1, 0.0)
    store.is_down = True
    with pytest.raises(StoreError):
        store.list_workers(1.0, 5.0)
    with pytest.raises(StoreError):
        beat(store, "w1", 1, 1.0)
    store.is_down = False
    assert [r.worker_id for r in store.list_workers(1.0, 5.0)] == ["w1"]
