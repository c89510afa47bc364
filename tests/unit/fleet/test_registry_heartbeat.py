"""Heartbeats write the worker registry; the gateway's registry reads, judges and reaps it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.fakes import MemoryJobStore
from conveyor.fleet.heartbeat import Heartbeat, WorkerIdentity
from conveyor.fleet.registry import FleetRegistry, model_loads, view_from_record
from conveyor.fleet.router import WorkerView
from conveyor.stores import JobStore, open_job_store
from conveyor.stores.errors import StoreUnavailableError
from conveyor.stores.records import WorkerRecord
from tests.virtual_time import run_virtual

pytestmark = pytest.mark.anyio


class Clock:
    """A settable wall clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    opened = open_job_store(f"sqlite://{tmp_path}/jobs.sqlite")
    yield opened
    opened.close()


def identity(worker_id: str = "w1") -> WorkerIdentity:
    return WorkerIdentity(worker_id, "http://127.0.0.1:9", ("m",), capacity=32)


def load(depth: int = 0) -> dict[str, object]:
    return {"in_flight": 1, "is_draining": False, "models": {"m": {"queue_depth": depth}}}


async def test_heartbeat_registers_and_deregisters(store: JobStore) -> None:
    clock = Clock()
    beat = Heartbeat(store, identity(), lambda: load(3), interval_s=0.01, clock=clock)
    await beat.beat()
    (record,) = store.list_workers(clock.now, stale_after_s=1)
    assert record.worker_id == "w1" and record.models == ("m",) and record.capacity == 32
    assert model_loads(record)["m"].queue_depth == 3
    await beat.deregister()
    assert store.list_workers(clock.now, stale_after_s=1) == []


async def test_heartbeat_loop_stops_after_its_current_beat(store: JobStore) -> None:
    third_beat = asyncio.Event()
    num_loads = 0

    def counting_load() -> dict[str, object]:
        nonlocal num_loads
        num_loads += 1
        if num_loads == 3:
            third_beat.set()
        return load()

    beat = Heartbeat(store, identity(), counting_load, interval_s=0.01)
    running = asyncio.create_task(beat.run())
    await asyncio.wait_for(third_beat.wait(), 5)
    await beat.stop(running)
    assert running.done() and beat.num_beats >= 3
    await beat.deregister()
    assert store.list_workers(0, 1) == []


async def test_registry_marks_stale_and_reaps_the_long_dead(store: JobStore) -> None:
    clock = Clock()
    for worker_id, age_s in (("fresh", 0.5), ("stale", 5.0), ("dead", 50.0)):
        store.upsert_worker(worker_id, "http://x:1", ["m"], 1, load(), clock.now - age_s)
    registry = FleetRegistry(store, stale_after_s=3, reap_after_s=30, clock=clock)
    assert not registry.has_refreshed
    await registry.refresh()
    assert registry.has_refreshed
    assert {v.worker_id: v.is_stale for v in registry.views} == {"fresh": False, "stale": True}
    assert [r.worker_id for r in store.list_workers(clock.now, 3)] == ["fresh", "stale"]


class FailsOnce(MemoryJobStore):
    """A registry whose second read fails."""

    num_reads = 0

    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        self.num_reads += 1
        if self.num_reads == 2:
            raise StoreUnavailableError("the store is unreachable")
        return super().list_workers(now, stale_after_s)


def test_registry_run_keeps_refreshing_every_interval_through_a_failure() -> None:
    registry = FleetRegistry(FailsOnce(), stale_after_s=3, reap_after_s=30)
    refreshed_at: list[float] = []

    async def main() -> None:
        third = asyncio.Event()

        def on_refresh() -> None:
            refreshed_at.append(asyncio.get_running_loop().time())
            if len(refreshed_at) == 3:
                third.set()

        task = asyncio.create_task(registry.run(1.0, on_refresh))
        # No timeout timer: the clock would jump past it while a read runs in its thread.
        # A loop that ends instead of refreshing ends the wait too, and fails the asserts.
        waiting = asyncio.create_task(third.wait())
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run_virtual(main())  # the loop's clock moves only by the intervals the loop waits
    assert registry.num_refreshes == 3 and registry.num_failed_refreshes == 1
    assert refreshed_at == pytest.approx([0.0, 2.0, 3.0])  # the read at 1.0 failed


def test_views_tolerate_missing_load_fields() -> None:
    record = WorkerRecord("w", "http://x", ("a", "b"), 4, {}, 10.0, 0.1, False)
    view = view_from_record(record)
    assert view.loaded_models == {"a", "b"} and view.queue_depth == {"a": 0, "b": 0}
    assert not view.is_draining


def test_views_carry_loaded_models_and_draining() -> None:
    raw = {"is_draining": True, "models": {"a": {"queue_depth": 4, "is_loaded": False}}}
    view = view_from_record(WorkerRecord("w", "http://x", ("a",), 4, raw, 10.0, 0.1, False))
    assert view.loaded_models == frozenset() and view.queue_depth == {"a": 4}
    assert view.is_draining


def test_bad_settings_are_rejected(store: JobStore) -> None:
    with pytest.raises(ValueError):
        FleetRegistry(store, stale_after_s=0, reap_after_s=1)
    with pytest.raises(ValueError):
        FleetRegistry(store, stale_after_s=5, reap_after_s=1)
    with pytest.raises(ValueError):
        Heartbeat(store, identity(), load, interval_s=0)
    with pytest.raises(ValueError):
        WorkerIdentity("w", "tcp://x", ("m",), 1)
    with pytest.raises(ValueError):
        WorkerIdentity("", "http://x", ("m",), 1)


def test_the_registry_builds_its_views_with_the_builder_it_is_given() -> None:
    store, clock = MemoryJobStore(), Clock()
    store.upsert_worker("w1", "http://x:1", ["m"], 1, load(4), clock.now)
    built: list[str] = []

    def view_of(record: WorkerRecord) -> WorkerView:
        built.append(record.worker_id)
        return view_from_record(record)

    default = FleetRegistry(store, stale_after_s=3, reap_after_s=30, clock=clock)
    given = FleetRegistry(store, stale_after_s=3, reap_after_s=30, clock=clock, view_of=view_of)
    for registry in (default, given):
        registry.adopt(store.list_workers(clock.now, 3), clock.now)
    assert built == ["w1"] and given.views == default.views
    assert given.views[0].queue_depth == {"m": 4}
