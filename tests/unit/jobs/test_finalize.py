"""Finalizing and supervising: live leases are waited for, dead ones released, files are
deterministic, bad inputs fail the batch with every bad line."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.jobs.finalize import Finalizer, final_status
from conveyor.jobs.keys import file_key
from conveyor.jobs.supervisor import Supervisor
from conveyor.stores.records import BatchStatus, ShardRecord, ShardStatus
from tests.unit.jobs.fakes import create_batch, input_file, make_ctx, records, status_of, upload
from tests.unit.jobs.test_shard_runner import run_all, start_batch

pytestmark = pytest.mark.anyio


def shard(status: ShardStatus, num_lines: int, completed: int, failed: int) -> ShardRecord:
    return ShardRecord("batch_x", 0, 0, 1, 0, num_lines, status, 1, None, None, None, None,
                       completed, failed, None, None)  # fmt: skip


def test_final_status_rules() -> None:
    done = shard(ShardStatus.DONE, 5, 4, 1)
    partial = shard(ShardStatus.DONE, 5, 2, 0)
    pending = shard(ShardStatus.PENDING, 5, 0, 0)
    assert final_status(BatchStatus.FINALIZING, [done, done]) is BatchStatus.COMPLETED
    assert final_status(BatchStatus.FINALIZING, [done, partial]) is BatchStatus.EXPIRED
    assert final_status(BatchStatus.FINALIZING, [done, pending]) is BatchStatus.EXPIRED
    assert final_status(BatchStatus.CANCELLING, [done]) is BatchStatus.CANCELLED
    with pytest.raises(ValueError):
        final_status(BatchStatus.IN_PROGRESS, [done])


async def test_a_live_lease_delays_finalizing_and_a_dead_one_is_released() -> None:
    ctx = make_ctx(lines_per_shard=5, lease_s=10.0)
    batch_id = await start_batch(ctx, 10)
    lease = ctx.store.blocking.claim_shard("dead-worker", ctx.clock(), 10.0)
    assert lease is not None
    ctx.store.blocking.transition(
        batch_id, [BatchStatus.IN_PROGRESS], BatchStatus.CANCELLING, ctx.clock()
    )
    finalizer = Finalizer(ctx)
    assert not finalizer.try_finalize(ctx.store.blocking.get_batch_any(batch_id))
    ctx.clock.now += 11  # type: ignore[attr-defined]
    assert finalizer.try_finalize(ctx.store.blocking.get_batch_any(batch_id))
    batch = ctx.store.blocking.get_batch_any(batch_id)
    assert batch.status is BatchStatus.CANCELLED and batch.output_file_id is None
    errors = records(ctx, batch.error_file_id)
    assert sorted(r["custom_id"] for r in errors) == sorted(f"r{i}" for i in range(10))
    assert not ctx.store.blocking.commit_shard(lease, ctx.clock(), None, None, 0, 0)  # fenced out


async def test_finalizing_twice_writes_the_same_files() -> None:
    ctx = make_ctx(lines_per_shard=4)
    batch_id = await start_batch(ctx, 9)
    await run_all(ctx)
    ctx.store.blocking.transition(
        batch_id, [BatchStatus.IN_PROGRESS], BatchStatus.FINALIZING, ctx.clock()
    )
    stale = ctx.store.blocking.get_batch_any(batch_id)
    assert Finalizer(ctx).try_finalize(stale)
    batch = ctx.store.blocking.get_batch_any(batch_id)
    first = ctx.objects.default.objects[file_key(batch.output_file_id)]  # type: ignore[attr-defined]
    assert not Finalizer(ctx).try_finalize(stale)  # lost the race: nothing changes
    assert ctx.objects.default.objects[file_key(batch.output_file_id)] == first  # type: ignore[attr-defined]
    assert status_of(ctx, batch_id) is BatchStatus.COMPLETED
    assert not [k for k in ctx.objects.default.objects if k.startswith("batches/")]  # type: ignore[attr-defined]


async def test_a_bad_input_fails_the_batch_listing_every_bad_line() -> None:
    ctx = make_ctx()
    source = upload(ctx, input_file(3) + b"{oops\n" + input_file(1))
    batch = create_batch(ctx, source.id)
    await Supervisor(ctx, asyncio.Event()).tick()
    failed = ctx.store.blocking.get_batch_any(batch.id)
    assert failed.status is BatchStatus.FAILED and failed.failed_at is not None
    assert [(e.line, e.code) for e in failed.errors] == [(4, "invalid_json_line"),
                                                         (5, "duplicate_custom_id")]  # fmt: skip
    assert ctx.store.blocking.list_shards(batch.id) == []


async def test_a_missing_input_object_fails_the_batch() -> None:
    ctx = make_ctx()
    source = upload(ctx, input_file(2))
    ctx.objects.default.delete(file_key(source.id))
    batch = create_batch(ctx, source.id)
    await Supervisor(ctx, asyncio.Event()).tick()
    assert [e.code for e in ctx.store.blocking.get_batch_any(batch.id).errors] == ["file_not_found"]


async def test_planning_again_after_a_crash_reuses_the_stored_shards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planner that died after storing the shards: the next one starts the batch on them."""
    ctx = make_ctx(lines_per_shard=2)
    source = upload(ctx, input_file(5))
    batch = create_batch(ctx, source.id)
    store = ctx.store.blocking
    start_batch_for_real = store.transition

    def die(*args: object, **kwargs: object) -> bool:
        raise RuntimeError("the planner died before starting the batch")

    monkeypatch.setattr(store, "transition", die)
    with pytest.raises(RuntimeError):
        await Supervisor(ctx, asyncio.Event()).plan(batch)
    stored = store.list_shards(batch.id)
    assert len(stored) == 3
    assert status_of(ctx, batch.id) is BatchStatus.VALIDATING

    monkeypatch.setattr(store, "transition", start_batch_for_real)
    inserts: list[object] = []
    monkeypatch.setattr(store, "add_shards", lambda *args: inserts.append(args))
    await Supervisor(ctx, asyncio.Event()).plan(batch)
    assert inserts == []  # nothing planned twice
    assert store.list_shards(batch.id) == stored
    assert status_of(ctx, batch.id) is BatchStatus.IN_PROGRESS


async def test_a_second_planner_finds_the_shards_and_loses_the_start() -> None:
    """Planning a batch that another planner already started changes nothing."""
    ctx = make_ctx(lines_per_shard=2)
    source = upload(ctx, input_file(5))
    batch = create_batch(ctx, source.id)
    supervisor = Supervisor(ctx, asyncio.Event())
    await supervisor.plan(batch)
    ctx.store.blocking.transition(
        batch.id, [BatchStatus.IN_PROGRESS], BatchStatus.CANCELLING, ctx.clock()
    )
    stored = ctx.store.blocking.list_shards(batch.id)
    await supervisor.plan(batch)  # a second planner finds the shards and loses the CAS
    assert ctx.store.blocking.list_shards(batch.id) == stored
    assert status_of(ctx, batch.id) is BatchStatus.CANCELLING


async def test_an_unfinished_batch_is_expired_by_the_supervisor() -> None:
    ctx = make_ctx(lines_per_shard=2)
    batch_id = await start_batch(ctx, 4)
    ctx.clock.now += 3601  # type: ignore[attr-defined]
    await Supervisor(ctx, asyncio.Event()).tick()
    batch = ctx.store.blocking.get_batch_any(batch_id)
    assert batch.status is BatchStatus.EXPIRED
    assert {r["error"]["code"] for r in records(ctx, batch.error_file_id)} == {"batch_expired"}
    assert batch.request_counts.total == 4 and batch.request_counts.completed == 0
