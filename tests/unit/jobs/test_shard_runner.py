"""Shard attempts and the runner loop on an in-memory store: windows, commits, stops, leases,
crashing lines. The clock is explicit; nothing waits on wall time except short heartbeats."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from conveyor.errors import InvalidRequest
from conveyor.fakes import MemoryJobStore
from conveyor.jobs.context import JobsContext
from conveyor.jobs.runner import ShardRunner
from conveyor.jobs.shard import AttemptOutcome, ShardAttempt
from conveyor.jobs.supervisor import Supervisor
from conveyor.jobs.views import batch_object
from conveyor.stores import open_job_store
from conveyor.stores.records import BatchStatus, ShardStatus
from tests.unit.jobs.fakes import (
    FakeEndpoint,
    create_batch,
    input_file,
    make_ctx,
    records,
    status_of,
    upload,
    wait_blocked,
)

pytestmark = pytest.mark.anyio

DEADLINE_S = 20.0


async def start_batch(ctx: JobsContext, num_lines: int) -> str:
    """Upload, create and plan a batch; return its id."""
    source = upload(ctx, input_file(num_lines))
    batch = create_batch(ctx, source.id)
    await Supervisor(ctx, asyncio.Event()).plan(batch)
    assert status_of(ctx, batch.id) is BatchStatus.IN_PROGRESS
    return batch.id


async def run_all(ctx: JobsContext, shutdown: asyncio.Event | None = None) -> ShardRunner:
    """Claim and run shards until none is claimable."""
    runner = ShardRunner(ctx, asyncio.Event())
    while lease := ctx.store.blocking.claim_shard(ctx.worker_id, ctx.clock(), ctx.config.lease_s):
        await runner.run_shard(lease, shutdown or asyncio.Event())
    return runner


async def finish(ctx: JobsContext, batch_id: str) -> dict:
    """Let the supervisor finalize; return the batch's files' records."""
    await Supervisor(ctx, asyncio.Event()).tick()
    batch = ctx.store.blocking.get_batch_any(batch_id)
    assert batch is not None
    return {"batch": batch, "outputs": records(ctx, batch.output_file_id),
            "errors": records(ctx, batch.error_file_id)}  # fmt: skip


def custom_ids(found: dict) -> list[str]:
    return sorted(r["custom_id"] for r in found["outputs"] + found["errors"])


async def test_every_line_runs_once_and_the_batch_completes() -> None:
    ctx = make_ctx(lines_per_shard=3)
    endpoint = ctx.run_request
    assert isinstance(endpoint, FakeEndpoint)
    endpoint.errors["text-4"] = [InvalidRequest("input too long", param="input")]
    batch_id = await start_batch(ctx, 10)
    runner = await run_all(ctx)
    found = await finish(ctx, batch_id)
    batch = found["batch"]
    assert runner.num_committed == 4 and batch.status is BatchStatus.COMPLETED
    assert (batch.request_counts.total, batch.request_counts.completed,
            batch.request_counts.failed) == (10, 9, 1)  # fmt: skip
    assert custom_ids(found) == sorted(f"r{i}" for i in range(10))
    assert [r["custom_id"] for r in found["errors"]] == ["r4"]
    assert found["errors"][0]["response"]["status_code"] == 400
    assert sorted(endpoint.calls) == sorted(f"text-{i}" for i in range(10))


async def test_lines_in_flight_stay_within_the_window() -> None:
    ctx = make_ctx(lines_per_shard=50, max_lines_in_flight=4)
    await start_batch(ctx, 50)
    await run_all(ctx)
    assert ctx.run_request.max_in_flight == 4  # type: ignore[attr-defined]


async def test_cancel_keeps_finished_lines_and_reports_the_rest() -> None:
    ctx = make_ctx(lines_per_shard=20, max_lines_in_flight=4)
    endpoint: FakeEndpoint = ctx.run_request  # type: ignore[assignment]
    endpoint.blocked = {f"text-{i}" for i in range(5, 30)}
    batch_id = await start_batch(ctx, 30)
    lease = ctx.store.blocking.claim_shard(ctx.worker_id, ctx.clock(), ctx.config.lease_s)
    assert lease is not None
    attempt = ShardAttempt(ctx, lease, ctx.store.blocking.get_batch_any(batch_id), asyncio.Event())
    running = asyncio.create_task(attempt.run())
    await wait_blocked(endpoint, 4)  # text-5..8 wait; text-8 started only after text-4 ended
    ctx.store.blocking.transition(
        batch_id, [BatchStatus.IN_PROGRESS], BatchStatus.CANCELLING, ctx.clock()
    )
    assert await running is AttemptOutcome.COMMITTED
    found = await finish(ctx, batch_id)
    batch = found["batch"]
    assert batch.status is BatchStatus.CANCELLED and batch.cancelled_at is not None
    assert sorted(r["custom_id"] for r in found["outputs"]) == [f"r{i}" for i in range(5)]
    assert {r["error"]["code"] for r in found["errors"]} == {"batch_cancelled"}
    assert all(r["response"] is None for r in found["errors"])
    assert custom_ids(found) == sorted(f"r{i}" for i in range(30))
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 0)


async def test_expiry_stops_running_shards_and_expires_pending_ones() -> None:
    ctx = make_ctx(lines_per_shard=10, max_lines_in_flight=2)
    endpoint: FakeEndpoint = ctx.run_request  # type: ignore[assignment]
    endpoint.blocked = {f"text-{i}" for i in range(2, 30)}
    batch_id = await start_batch(ctx, 30)
    lease = ctx.store.blocking.claim_shard(ctx.worker_id, ctx.clock(), ctx.config.lease_s)
    assert lease is not None
    attempt = ShardAttempt(ctx, lease, ctx.store.blocking.get_batch_any(batch_id), asyncio.Event())
    running = asyncio.create_task(attempt.run())
    await wait_blocked(endpoint, 2)
    ctx.clock.now += 4000  # type: ignore[attr-defined]  # past the one-hour window
    assert await running is AttemptOutcome.COMMITTED
    found = await finish(ctx, batch_id)
    assert found["batch"].status is BatchStatus.EXPIRED
    assert found["batch"].finalizing_at is not None and found["batch"].expired_at is not None
    assert custom_ids(found) == sorted(f"r{i}" for i in range(30))
    expired = [r for r in found["errors"] if r["error"]["code"] == "batch_expired"]
    assert len(found["outputs"]) == 2 and len(expired) == 28


async def test_a_lost_lease_commits_nothing_and_the_new_holder_finishes() -> None:
    ctx = make_ctx(lines_per_shard=10, lease_s=5.0)
    endpoint: FakeEndpoint = ctx.run_request  # type: ignore[assignment]
    endpoint.blocked = {"text-3"}
    batch_id = await start_batch(ctx, 10)
    lease = ctx.store.blocking.claim_shard("w1", ctx.clock(), ctx.config.lease_s)
    assert lease is not None
    attempt = ShardAttempt(ctx, lease, ctx.store.blocking.get_batch_any(batch_id), asyncio.Event())
    ctx.clock.now += 10  # type: ignore[attr-defined]  # w1 looks dead: its lease expired
    taken = ctx.store.blocking.claim_shard("w2", ctx.clock(), ctx.config.lease_s)
    assert taken is not None and taken.attempt == 2
    assert await attempt.run() is AttemptOutcome.LOST
    endpoint.blocked.clear()
    other = make_ctx(
        store=ctx.store.blocking, objects=ctx.objects.default, clock=ctx.clock, worker_id="w2"
    )
    assert await ShardAttempt(other, taken, ctx.store.blocking.get_batch_any(batch_id),
                              asyncio.Event()).run() is AttemptOutcome.COMMITTED  # fmt: skip
    found = await finish(ctx, batch_id)
    assert found["batch"].status is BatchStatus.COMPLETED
    assert custom_ids(found) == sorted(f"r{i}" for i in range(10))
    # The lost attempt's usage went with its results: each line is billed once.
    assert found["batch"].usage.input_tokens == 10 * len("text-0")
    assert sum(row.input_tokens for row in ctx.store.blocking.list_usage(0)) == 60


class CountsSeen:
    """Samples a batch's reported `request_counts` on every turn of the event loop."""

    def __init__(self, ctx: JobsContext, batch_id: str) -> None:
        self._ctx, self._batch_id = ctx, batch_id
        self.seen: list[tuple[int, int]] = []
        self._target = 0
        self._reached = asyncio.Event()
        self._task = asyncio.create_task(self._sample())

    def now(self) -> tuple[int, int]:
        batch = self._ctx.store.blocking.get_batch_any(self._batch_id)
        assert batch is not None
        counts = batch_object(batch)["request_counts"]
        return counts["completed"], counts["failed"]

    async def _sample(self) -> None:
        while True:
            self.seen.append(self.now())
            if self.seen[-1][0] >= self._target:
                self._reached.set()
            await asyncio.sleep(0)

    async def until(self, completed: int) -> None:
        self._target = completed
        self._reached.clear()
        await asyncio.wait_for(self._reached.wait(), DEADLINE_S)

    async def stop(self) -> list[tuple[int, int]]:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.seen


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_counts_never_go_back_when_a_lost_shard_reruns(store: str) -> None:
    job_store = MemoryJobStore() if store == "memory" else open_job_store("sqlite://:memory:")
    ctx = make_ctx(store=job_store, lines_per_shard=10, lease_s=5.0, max_lines_in_flight=1)
    endpoint: FakeEndpoint = ctx.run_request  # type: ignore[assignment]
    endpoint.blocked = {"text-6"}
    batch_id = await start_batch(ctx, 10)
    lease = ctx.store.blocking.claim_shard("w1", ctx.clock(), ctx.config.lease_s)
    assert lease is not None
    batch = ctx.store.blocking.get_batch_any(batch_id)
    lost = asyncio.create_task(ShardAttempt(ctx, lease, batch, asyncio.Event()).run())
    counts = CountsSeen(ctx, batch_id)
    await counts.until(completed=6)  # the heartbeat reported lines 0-5
    ctx.clock.now += 10  # type: ignore[attr-defined]  # w1 looks dead: its lease expired
    taken = ctx.store.blocking.claim_shard("w2", ctx.clock(), ctx.config.lease_s)
    assert taken is not None and taken.attempt == 2
    assert counts.now() == (6, 0)  # the new attempt starts over; the figure holds
    assert await lost is AttemptOutcome.LOST
    endpoint.blocked.clear()
    other = make_ctx(
        store=ctx.store.blocking, objects=ctx.objects.default, clock=ctx.clock, worker_id="w2"
    )
    rerun = ShardAttempt(other, taken, ctx.store.blocking.get_batch_any(batch_id), asyncio.Event())
    assert await rerun.run() is AttemptOutcome.COMMITTED
    found = await finish(ctx, batch_id)
    seen = await counts.stop()
    assert seen == sorted(seen) and seen[-1] == (10, 0)
    assert found["batch"].status is BatchStatus.COMPLETED
    assert custom_ids(found) == sorted(f"r{i}" for i in range(10))  # each exactly once


async def test_line_usage_commits_with_the_shard_to_the_batch_tenant() -> None:
    ctx = make_ctx(lines_per_shard=4)
    batch_id = await start_batch(ctx, 10)
    await run_all(ctx)
    found = await finish(ctx, batch_id)
    (row,) = ctx.store.blocking.list_usage(0)
    assert (row.tenant, row.model, row.num_requests) == ("t", "m", 10)
    assert row.input_tokens == found["batch"].usage.input_tokens == 60
    assert row.model_s == pytest.approx(0.06)


async def test_shutdown_releases_the_shard_for_the_next_process() -> None:
    ctx = make_ctx(lines_per_shard=10)
    endpoint: FakeEndpoint = ctx.run_request  # type: ignore[assignment]
    endpoint.blocked = {"text-1"}
    batch_id = await start_batch(ctx, 10)
    shutdown = asyncio.Event()
    lease = ctx.store.blocking.claim_shard(ctx.worker_id, ctx.clock(), ctx.config.lease_s)
    assert lease is not None
    running = asyncio.create_task(ShardRunner(ctx, asyncio.Event()).run_shard(lease, shutdown))
    await wait_blocked(endpoint, 1)
    shutdown.set()
    assert await running
    (shard,) = ctx.store.blocking.list_shards(batch_id)
    assert shard.status is ShardStatus.PENDING and shard.attempt == 1


async def test_a_line_that_keeps_crashing_is_isolated_by_bisection() -> None:
    ctx = make_ctx(lines_per_shard=8, isolate_after_attempts=2)
    endpoint: FakeEndpoint = ctx.run_request  # type: ignore[assignment]
    endpoint.crash_on = {"text-5"}
    batch_id = await start_batch(ctx, 8)
    runner = await run_all(ctx)
    found = await finish(ctx, batch_id)
    assert found["batch"].status is BatchStatus.COMPLETED
    assert custom_ids(found) == sorted(f"r{i}" for i in range(8))
    (isolated,) = found["errors"]
    assert isolated["custom_id"] == "r5" and isolated["error"]["code"] == "request_isolated"
    assert runner.num_committed == 1 and runner.num_failed_attempts == 5
    assert endpoint.calls.count("text-0") == 3  # twice whole, once in its piece; then reused
    assert not [k for k in ctx.objects.default.objects if "/pieces/" in k]  # type: ignore[attr-defined]


async def test_the_result_cache_answers_repeated_lines() -> None:
    ctx = make_ctx(lines_per_shard=4, result_cache=True)
    endpoint: FakeEndpoint = ctx.run_request  # type: ignore[assignment]
    first = await start_batch(ctx, 6)
    await run_all(ctx)
    second = await start_batch(ctx, 6)
    await run_all(ctx)
    assert len(endpoint.calls) == 6 and ctx.counters.num_cache_hits == 6
    one, two = await finish(ctx, first), await finish(ctx, second)
    bodies = lambda f: sorted(str(r["response"]["body"]) for r in f["outputs"])  # noqa: E731
    assert bodies(one) == bodies(two) and two["batch"].status is BatchStatus.COMPLETED


async def test_a_runner_claims_only_batches_of_models_it_runs() -> None:
    ctx = make_ctx()
    batch_id = await start_batch(ctx, 4)
    batch = ctx.store.blocking.get_batch_any(batch_id)
    assert batch is not None and batch.model is not None
    ctx.can_run_model = lambda name: name != batch.model
    runner = ShardRunner(ctx, asyncio.Event())
    assert await runner._claim() is None  # another worker hosts that model
    ctx.can_run_model = lambda name: name == batch.model
    lease = await runner._claim()
    assert lease is not None and lease.batch_id == batch_id


async def test_a_runner_claims_a_resident_tenants_shards_only_in_its_regions() -> None:
    ctx = make_ctx()
    batch_id = await start_batch(ctx, 4)
    batch = ctx.store.blocking.get_batch_any(batch_id)
    assert batch is not None
    ctx.tenant_regions = {batch.tenant: frozenset({"eu"})}
    runner = ShardRunner(ctx, asyncio.Event())
    assert not ctx.may_run_tenant(batch.tenant)  # this process has no region
    assert await runner._claim() is None
    ctx.config = ctx.config.model_copy(update={"region": "us"})
    assert await runner._claim() is None  # another region: never here
    ctx.config = ctx.config.model_copy(update={"region": "eu"})
    lease = await runner._claim()
    assert lease is not None and lease.batch_id == batch_id
    assert ctx.may_run_tenant("someone-unpinned")


async def test_each_line_is_decoded_once_per_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache lookup, the run and the records share one decode of each line."""
    import conveyor.jobs.shard as shard_module

    decoded: list[bytes] = []
    real_decode = shard_module.decode_line

    def counting(raw: bytes):  # type: ignore[no-untyped-def]
        decoded.append(raw)
        return real_decode(raw)

    monkeypatch.setattr(shard_module, "decode_line", counting)
    ctx = make_ctx(lines_per_shard=10, result_cache=True)
    batch_id = await start_batch(ctx, 10)
    await run_all(ctx)
    assert custom_ids(await finish(ctx, batch_id)) == sorted(f"r{i}" for i in range(10))
    assert len(decoded) == 10
