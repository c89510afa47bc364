"""The supervisor: moves batches through their lifecycle.

Every tick (and whenever the API kicks it) it scans the job store:

- `validating`: validate the input and plan shards, then `in_progress` (or `failed`, listing
  every bad line);
- `in_progress`: past `expires_at`, or with every shard done, go to `finalizing`;
- `finalizing` / `cancelling`: assemble the output and error files (see `finalize`);
- files past their `expires_at` are deleted (see `expiry`).

Every move is a compare-and-set in the store, so several processes may supervise the same
store; a batch left half-way by a crash is picked up again on the next tick after a restart.
A store failure only delays a batch: it is reported (see `stalls`) and retried next tick,
with a longer wait while the store keeps failing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from conveyor.jobs.context import JobsContext, wait_for_any
from conveyor.jobs.expiry import delete_expired_files
from conveyor.jobs.finalize import Finalizer
from conveyor.jobs.keys import file_key
from conveyor.jobs.message_batch_input import max_requests_of
from conveyor.jobs.planner import BatchPlan, plan_batch
from conveyor.jobs.queue_limit import QUEUED_STATUSES, queue_limit_error, queued_tokens
from conveyor.jobs.stalls import StallReporter, backoff_s
from conveyor.stores.errors import (
    ObjectNotFoundError,
    ObjectStoreError,
    StoreError,
    StoreUnavailableError,
)
from conveyor.stores.records import BatchError, BatchRecord, BatchStatus, ShardStatus

log = logging.getLogger(__name__)


class Supervisor:
    """Plans, expires and finalizes the batches of one job store."""

    def __init__(
        self, ctx: JobsContext, wake_runners: asyncio.Event, stalls: StallReporter | None = None
    ) -> None:
        """`wake_runners` is set after a batch is planned, so runners claim at once."""
        self._ctx = ctx
        self._finalizer = Finalizer(ctx)
        self._wake_runners = wake_runners
        self._stalls = stalls or StallReporter(ctx)
        self.num_failed_ticks_in_a_row = 0

    async def run_forever(self, shutdown: asyncio.Event, kick: asyncio.Event) -> None:
        """Tick every `poll_every_s`, or sooner when `kick` is set; back off while failing."""
        poll_s = self._ctx.config.poll_every_s
        while not shutdown.is_set():
            kick.clear()
            try:
                await self.tick()
                self.num_failed_ticks_in_a_row = 0
            except Exception as exc:  # keep supervising: the next tick retries from stored state
                self.num_failed_ticks_in_a_row += 1
                if not self._stalls.failed("supervise", exc):
                    log.exception("batch supervision failed; retrying")
            wait_s = backoff_s(self.num_failed_ticks_in_a_row, poll_s)
            await wait_for_any([shutdown, kick], wait_s)

    async def tick(self) -> None:
        """One pass over every batch that is not finished."""
        store = self._ctx.store
        for batch in await store.batches_in_status([BatchStatus.VALIDATING]):
            await self._guarded("plan", batch, self.plan(batch))
        for batch in await store.batches_in_status([BatchStatus.IN_PROGRESS]):
            await self._guarded("check_progress", batch, self._maybe_finish(batch))
        finalizable = [BatchStatus.FINALIZING, BatchStatus.CANCELLING]
        for batch in await store.batches_in_status(finalizable):
            await self._guarded("finalize", batch, self._finalize(batch))
        await self._expire_files()

    async def _expire_files(self) -> None:
        """Delete expired files; a failure is logged and the next tick tries again."""
        try:
            await asyncio.to_thread(delete_expired_files, self._ctx)
        except StoreUnavailableError:
            raise
        except (StoreError, ObjectStoreError, OSError) as exc:
            log.error("cannot delete expired files yet", exc_info=exc)

    async def _guarded(self, operation: str, batch: BatchRecord, step: Awaitable[None]) -> None:
        """Run one batch's step; a store failure is reported and left for the next tick."""
        try:
            await step
        except StoreUnavailableError:
            raise  # nothing else can move either: end the tick and back off
        except (StoreError, ObjectStoreError, OSError, ValueError) as exc:
            if not self._stalls.failed(operation, exc, batch.id):
                log.error("cannot %s batch %s yet", operation, batch.id, exc_info=exc)
            elif self._stalls.should_note(exc):
                await asyncio.to_thread(self._stalls.note, batch.id, operation, exc)

    async def _finalize(self, batch: BatchRecord) -> None:
        """Finalize a batch if it is ready."""
        if await asyncio.to_thread(self._finalizer.try_finalize, batch):
            self._stalls.forget(batch.id)

    async def plan(self, batch: BatchRecord) -> None:
        """Validate a batch's input; fail it, or store its shards and start it."""
        ctx = self._ctx
        try:
            plan = await asyncio.to_thread(self._plan, batch)
        except ObjectNotFoundError:
            error = BatchError("file_not_found", f"input file {batch.input_file_id} is gone")
            await self._fail(batch, [error])
            return
        errors = plan.report.errors or await self._queue_errors(batch, plan)
        if errors:
            await self._fail(batch, errors)
            return
        await asyncio.to_thread(self._store_shards, batch, plan)
        is_started = await ctx.store.transition(
            batch.id, [BatchStatus.VALIDATING], BatchStatus.IN_PROGRESS, ctx.clock(),
            model=plan.report.model, queued_input_tokens=plan.report.num_input_tokens,
        )  # fmt: skip
        if is_started:
            self._stalls.forget(batch.id)  # a stall while planning is over
            log.info("batch %s: %d requests in %d shards",
                     batch.id, plan.report.num_requests, len(plan.shards))  # fmt: skip
            self._wake_runners.set()

    async def _queue_errors(self, batch: BatchRecord, plan: BatchPlan) -> list[BatchError]:
        """`token_limit_exceeded` when the batch would overfill its tenant's queue bound."""
        bound = self._ctx.batch_queue_tokens
        model = plan.report.model
        limit = None if bound is None or model is None else bound(batch.tenant, model)
        if limit is None or model is None:
            return []
        active = await self._ctx.store.batches_in_status(QUEUED_STATUSES)
        num_queued = queued_tokens(active, batch.tenant, model, batch.id)
        error = queue_limit_error(limit, num_queued, plan.report.num_input_tokens)
        return [] if error is None else [error]

    def _plan(self, batch: BatchRecord) -> BatchPlan:
        """Blocking: stream the input once, validating and planning shards."""
        cfg = self._ctx.config
        return plan_batch(
            self._ctx.objects.for_tenant(batch.tenant), file_key(batch.input_file_id),
            endpoint=batch.endpoint, is_model_served=self._ctx.is_model_served,
            lines_per_shard=cfg.lines_per_shard,
            max_requests=max_requests_of(cfg, batch.endpoint),
            max_listed_errors=cfg.max_listed_errors,
        )  # fmt: skip

    def _store_shards(self, batch: BatchRecord, plan: BatchPlan) -> None:
        """Insert the shards unless an earlier (crashed) or concurrent planner already did."""
        store = self._ctx.store.blocking
        if store.list_shards(batch.id):
            return
        try:
            store.add_shards(batch.id, plan.shards)
        except StoreError:
            if not store.list_shards(batch.id):
                raise

    async def _fail(self, batch: BatchRecord, errors: list[BatchError]) -> None:
        """Mark a batch that cannot run as failed, with its errors."""
        ctx = self._ctx
        await ctx.store.transition(
            batch.id, [BatchStatus.VALIDATING], BatchStatus.FAILED, ctx.clock(), errors=errors
        )

    async def _maybe_finish(self, batch: BatchRecord) -> None:
        """Move a running batch to finalizing once it expired or every shard is done."""
        ctx = self._ctx
        is_expired = batch.expires_at is not None and batch.expires_at <= ctx.clock()
        if not is_expired:
            counts = await ctx.store.count_shards(batch.id)
            if counts[ShardStatus.PENDING] or counts[ShardStatus.LEASED]:
                return
        await ctx.store.transition(
            batch.id, [BatchStatus.IN_PROGRESS], BatchStatus.FINALIZING, ctx.clock()
        )
