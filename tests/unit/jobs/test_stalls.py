"""Batches stalled by storage: the supervisor and runner loops survive store failures, count
and report them, note an object store outage on the batch, and finish the batch by themselves
once the store serves again. State is polled with deadlines; nothing sleeps and hopes."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from conveyor.dashboard.state import job_row
from conveyor.jobs.context import JobCounters, JobsContext
from conveyor.jobs.runner import ShardRunner
from conveyor.jobs.stalls import (
    StallReporter,
    backoff_s,
    failed_store,
    is_outage,
    stall_note,
    stall_reason,
    without_stall_notes,
)
from conveyor.jobs.supervisor import Supervisor
from conveyor.jobs.views import batch_object
from conveyor.observability.metrics import Metrics
from conveyor.stores import JobStore, StoreError, StoreUnavailableError, open_job_store
from conveyor.stores.errors import ObjectStoreError, ObjectStoreUnavailableError
from conveyor.stores.records import BatchError, BatchStatus
from tests.polling import until_async
from tests.unit.jobs.fakes import MemoryObjectStore, make_ctx, records, status_of
from tests.unit.jobs.test_shard_runner import start_batch

pytestmark = pytest.mark.anyio

DEADLINE_S = 20.0
NUM_LINES = 20


class FullObjectStore(MemoryObjectStore):
    """While `is_full`, refuses every write that holds a byte, as a full disk does (an empty
    object, such as a piece's `started` marker, needs no data block and still fits)."""

    def __init__(self) -> None:
        super().__init__()
        self.is_full = False

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        data = b"".join(chunks)
        if self.is_full and data:
            full = OSError(errno.ENOSPC, "No space left on device")
            raise ObjectStoreUnavailableError(f"i/o error on {key!r}: {full}") from full
        return super().put_stream(key, [data])


class DownJobStore:
    """Wraps a job store; every call fails as an unreachable database would while `is_down`."""

    def __init__(self, inner: JobStore) -> None:
        self._inner = inner
        self.is_down = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.is_down:
                raise StoreUnavailableError("postgres unavailable: connection refused")
            return method(*args, **kwargs)

        return call


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` until it holds; fail after DEADLINE_S."""
    await until_async(condition, what, timeout_s=DEADLINE_S, interval_s=0.01)


class Loops:
    """The supervisor and one shard runner of a process, running in the background."""

    def __init__(self, ctx: JobsContext) -> None:
        self.ctx = ctx
        self.shutdown = asyncio.Event()
        kick, wake = asyncio.Event(), asyncio.Event()
        stalls = StallReporter(ctx)
        self.supervisor = Supervisor(ctx, wake, stalls)
        self.runner = ShardRunner(ctx, wake, kick, stalls)
        self.tasks = [
            asyncio.create_task(self.supervisor.run_forever(self.shutdown, kick)),
            asyncio.create_task(self.runner.run_forever(self.shutdown)),
        ]

    def num_errors(self, store: str, operation: str) -> int:
        return self.ctx.counters.num_store_errors.get((store, operation), 0)

    def are_running(self) -> bool:
        return not any(task.done() for task in self.tasks)

    async def stop(self) -> None:
        self.shutdown.set()
        await asyncio.gather(*self.tasks)


def assert_completed_once_each(ctx: JobsContext, batch_id: str) -> None:
    batch = ctx.store.blocking.get_batch_any(batch_id)
    assert batch is not None and batch.status is BatchStatus.COMPLETED
    assert batch.errors is None  # the stall note went with the stall
    ids = [r["custom_id"] for r in records(ctx, batch.output_file_id)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(NUM_LINES))
    assert records(ctx, batch.error_file_id) == []


def num_stalled(metrics: Metrics, store: str, reason: str) -> float | None:
    labels = {"store": store, "reason": reason}
    return metrics.registry.get_sample_value("conveyor_batches_stalled", labels)


async def test_a_full_object_store_stalls_the_batch_visibly_until_it_has_room() -> None:
    objects = FullObjectStore()
    ctx = make_ctx(objects=objects, lines_per_shard=5)
    metrics = Metrics()
    ctx.counters = JobCounters(metrics)
    batch_id = await start_batch(ctx, NUM_LINES)
    objects.is_full = True
    stalled_at = ctx.clock()
    loops = Loops(ctx)
    try:
        # Enough failed attempts that the shards are bisected (isolate_after_attempts=2).
        await until(lambda: loops.num_errors("object_store", "run_shard") >= 8, "failed commits")
        batch = ctx.store.blocking.get_batch_any(batch_id)
        assert batch is not None and batch.status is BatchStatus.IN_PROGRESS
        assert [e.code for e in batch.errors or ()] == ["object_store_unavailable"]
        assert "No space left" in (batch.errors or [])[0].message
        assert num_stalled(metrics, "object_store", "disk_full") == 1
        assert job_row(batch)["stall"] == {
            "code": "object_store_unavailable", "since": int(stalled_at),
            "message": (batch.errors or [])[0].message,
        }  # fmt: skip
        assert batch_object(batch)["errors"]["data"][0].keys() == {"code", "message", "param",
                                                                  "line"}  # fmt: skip
        objects.is_full = False
        await until(lambda: status_of(ctx, batch_id) is BatchStatus.COMPLETED, "completion")
        assert loops.are_running()
        assert num_stalled(metrics, "object_store", "disk_full") == 0
    finally:
        await loops.stop()
    assert_completed_once_each(ctx, batch_id)
    done = ctx.store.blocking.get_batch_any(batch_id)
    assert done is not None and job_row(done)["stall"] is None


async def test_an_unreachable_job_store_is_waited_out_without_a_restart() -> None:
    store = DownJobStore(open_job_store("sqlite://:memory:"))
    ctx = make_ctx(store=store, lines_per_shard=5)  # type: ignore[arg-type]
    batch_id = await start_batch(ctx, NUM_LINES)
    store.is_down = True
    loops = Loops(ctx)
    try:
        await until(
            lambda: (
                loops.num_errors("job_store", "claim_shard") >= 3
                and loops.num_errors("job_store", "supervise") >= 3
            ),
            "failed claims and ticks",
        )
        assert loops.are_running()
        assert loops.runner.num_failures_in_a_row >= 3  # it backs off meanwhile
        store.is_down = False
        await until(lambda: status_of(ctx, batch_id) is BatchStatus.COMPLETED, "completion")
    finally:
        await loops.stop()
    assert_completed_once_each(ctx, batch_id)


def test_failures_are_attributed_to_their_store() -> None:
    assert failed_store(StoreUnavailableError("x")) == "job_store"
    assert failed_store(StoreError("constraint")) == "job_store"
    assert failed_store(ObjectStoreUnavailableError("x")) == "object_store"
    assert failed_store(ObjectStoreError("x")) == "object_store"
    assert failed_store(OSError(errno.ENOSPC, "No space left on device")) == "local_disk"
    assert failed_store(OSError(errno.ECONNRESET, "reset")) is None
    assert failed_store(RuntimeError("a bug")) is None
    assert is_outage(StoreUnavailableError("x")) and is_outage(OSError(errno.EDQUOT, "quota"))
    assert not is_outage(StoreError("constraint")) and not is_outage(ObjectStoreError("x"))


def test_backoff_doubles_from_the_poll_interval_up_to_a_cap() -> None:
    assert [backoff_s(n, 0.5, max_s=3.0) for n in range(6)] == [0.5, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_s(1000, 0.5, max_s=3.0) == 3.0
    assert backoff_s(3, 10.0, max_s=3.0) == 10.0  # never below the poll interval


def test_a_full_disk_is_told_from_other_outages() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        raise ObjectStoreUnavailableError("i/o error on 'k'") from full
    except ObjectStoreUnavailableError as wrapped:
        assert stall_reason(wrapped) == "disk_full"
    assert stall_reason(OSError(errno.EDQUOT, "Disk quota exceeded")) == "disk_full"
    assert stall_reason(OSError(errno.EIO, "Input/output error")) == "unavailable"
    assert stall_reason(StoreUnavailableError("connection refused")) == "unavailable"
    sqlite_full = sqlite3.OperationalError("database or disk is full")
    sqlite_full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    try:
        raise StoreUnavailableError("sqlite unavailable") from sqlite_full
    except StoreUnavailableError as wrapped:
        assert stall_reason(wrapped) == "disk_full"


def test_stall_notes_are_removed_and_other_errors_kept() -> None:
    full = OSError(errno.ENOSPC, "No space left")
    note = stall_note("object_store", "run_shard", full, since=1234.5)
    assert note.code == "object_store_unavailable" and "object store is full" in note.message
    assert note.since == 1234
    other = BatchError("invalid_json", "line 3 is not JSON", line=3)
    assert without_stall_notes([note, other]) == [other]
    assert without_stall_notes([note]) is None
    assert without_stall_notes(None) is None
