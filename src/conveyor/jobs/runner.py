"""The shard runner loop: claim a shard, run it, commit; repeat until told to stop.

Each runner holds one shard at a time. A process runs `num_shard_runners` of them so the
model never waits at a shard boundary. Claims go through the job store, so any number of
processes (and hosts, with PostgreSQL) share the work; leases make a dead runner's shard
claimable again once its lease expires.

A runner with nothing to claim may instead take a speculative second run of a straggler (a
shard running far longer than its batch's median, see `SpeculationPolicy`); whichever run
commits first wins and the other finds its commit refused.

A store that fails (unreachable, full) never stops the loop: the failure is reported (see
`stalls`), the runner backs off, and it claims again until the store serves once more.
"""

from __future__ import annotations

import asyncio
import logging

from conveyor.jobs.claims import claim_fairly
from conveyor.jobs.context import JobsContext, shielded, wait_for_any
from conveyor.jobs.leases import SpeculationPolicy
from conveyor.jobs.shard import AttemptOutcome, ShardAttempt
from conveyor.jobs.stalls import StallReporter, backoff_s
from conveyor.stores.errors import ObjectStoreError, StoreError
from conveyor.stores.records import BatchRecord, BatchStatus, ShardLease

log = logging.getLogger(__name__)


class ShardRunner:
    """Claims and runs shards until `shutdown` is set."""

    def __init__(
        self,
        ctx: JobsContext,
        wake: asyncio.Event,
        committed: asyncio.Event | None = None,
        stalls: StallReporter | None = None,
    ) -> None:
        """`wake` is set when work may be claimable; we set `committed` after each commit."""
        self._ctx = ctx
        self._wake = wake
        self._committed = committed
        self._stalls = stalls or StallReporter(ctx)
        self.num_committed = 0
        self.num_failed_attempts = 0
        self.num_speculative = 0
        self.num_failures_in_a_row = 0

    async def run_forever(self, shutdown: asyncio.Event) -> None:
        """The loop: claim, run, and wait a little whenever there is nothing to do.

        After a failure (a store error, a shard attempt that failed) it waits longer each
        time in a row, up to `BACKOFF_MAX_S`, so a dead store is not hammered.
        """
        poll_s = self._ctx.config.poll_every_s
        while not shutdown.is_set():
            lease = await self._claim()
            if lease is None:
                await wait_for_any([shutdown, self._wake], self._wait_s(poll_s))
                self._wake.clear()
                continue
            try:
                is_ok = await self.run_shard(lease, shutdown)
            except (StoreError, ObjectStoreError, OSError) as exc:
                if not self._stalls.failed("run_shard", exc, lease.batch_id):
                    log.exception("shard %d of %s: store failure", lease.index, lease.batch_id)
                is_ok = False
            self.num_failures_in_a_row = 0 if is_ok else self.num_failures_in_a_row + 1
            if not is_ok:
                # Back off so a shard that fails at once does not spin the loop.
                await wait_for_any([shutdown], self._wait_s(poll_s))

    def _wait_s(self, poll_s: float) -> float:
        """The idle wait: `poll_s`, or the backoff after failures in a row."""
        return (
            backoff_s(self.num_failures_in_a_row, poll_s) if self.num_failures_in_a_row else poll_s
        )

    async def _claim(self) -> ShardLease | None:
        """Lease the next claimable shard (fair across tenants, see `claims`), else a
        straggler's speculative run, else None.

        None also when the store is unreachable.
        """
        ctx = self._ctx
        cfg = ctx.config
        try:
            batches, is_every_batch = await self._runnable_batches()
            lease = await claim_fairly(ctx, batches)
            if lease is not None or not cfg.speculation or not is_every_batch:
                # Speculation takes any batch's straggler, so only a process that runs
                # every model speculates.
                return lease
            policy = SpeculationPolicy(cfg.speculation_slow_factor, cfg.speculation_min_running_s)
            lease = await ctx.store.claim_speculative(
                ctx.worker_id, ctx.clock(), cfg.lease_s, policy
            )
        except StoreError as exc:
            if not self._stalls.failed("claim_shard", exc):
                log.exception("cannot claim a shard")
            self.num_failures_in_a_row += 1
            return None
        self.num_failures_in_a_row = 0
        if lease is not None:
            self.num_speculative += 1
            log.info("speculating on straggler shard %d of %s", lease.index, lease.batch_id)
        return lease

    async def _runnable_batches(self) -> tuple[list[BatchRecord], bool]:
        """In-progress batches whose model this process runs and whose tenant's residency
        allows it here, and whether that is all of them."""
        ctx = self._ctx
        can_run = ctx.can_run_model or (lambda model: True)
        batches = await ctx.store.batches_in_status([BatchStatus.IN_PROGRESS])
        runnable = [
            b for b in batches
            if (b.model is None or can_run(b.model)) and ctx.may_run_tenant(b.tenant)
        ]  # fmt: skip
        return runnable, len(runnable) == len(batches)

    async def run_shard(self, lease: ShardLease, shutdown: asyncio.Event) -> bool:
        """Run one claimed shard; False when the attempt failed (the shard was released)."""
        ctx = self._ctx
        batch = await ctx.store.get_batch_any(lease.batch_id)
        if batch is None:
            return True  # deleted under us; nothing to run or release
        attempt = ShardAttempt(ctx, lease, batch, shutdown)
        try:
            outcome = await attempt.run()
        except asyncio.CancelledError:
            await self._release(lease)
            raise
        except Exception as exc:
            # Anything that is not a line's own error lands here: the shard goes back, and a
            # shard that keeps failing is bisected on later attempts (see `isolation`).
            self.num_failed_attempts += 1
            await self._report_failure(lease, exc)
            await self._release(lease)
            return False
        if outcome is AttemptOutcome.INTERRUPTED:
            await self._release(lease)
        elif outcome is AttemptOutcome.COMMITTED:
            self.num_committed += 1
            if self._stalls.is_stalled(lease.batch_id):
                await asyncio.to_thread(self._stalls.recovered, lease.batch_id)
            if self._committed is not None:
                self._committed.set()  # the batch may be complete: supervise it now
        return True

    async def _report_failure(self, lease: ShardLease, exc: Exception) -> None:
        """Log a failed attempt: one line for a store failure (noted on the batch), else a
        traceback."""
        if not self._stalls.failed("run_shard", exc, lease.batch_id):
            log.error(
                "shard %d of %s failed on attempt %d", lease.index, lease.batch_id, lease.attempt,
                exc_info=exc,
            )  # fmt: skip
        elif self._stalls.should_note(exc):
            await asyncio.to_thread(self._stalls.note, lease.batch_id, "run_shard", exc)

    async def _release(self, lease: ShardLease) -> None:
        """Give the shard back now (not at lease expiry); a store error only delays that."""
        try:
            await shielded(lambda: self._ctx.store.release_shard(lease))
        except StoreError as exc:
            if not self._stalls.failed("release_shard", exc, lease.batch_id):
                log.exception("cannot release shard %d of %s", lease.index, lease.batch_id)
