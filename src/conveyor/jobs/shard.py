"""One attempt at one shard: run its lines, keep the lease, write outputs, commit.

While the attempt runs, a heartbeat renews the lease, reports progress (so the batch's
`request_counts` move) and watches the batch: on cancel or expiry the attempt stops
launching lines, drops those still queued, and commits what finished plus a
`batch_cancelled` / `batch_expired` record for every other line. On shutdown or a lost lease
it commits nothing: the shard is released or already belongs to a newer attempt.

Lines run through the model's scheduler at batch priority with at most
`max_lines_in_flight` of them queued, so a job never floods the queue and online requests
are always served first.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Sequence
from typing import Any

from conveyor.jobs.cache import ResultCache, cache_key
from conveyor.jobs.context import JobsContext, shielded, wait_for_event
from conveyor.jobs.isolation import Piece, PieceCheckpoints, PieceState, plan_pieces
from conveyor.jobs.keys import file_key, line_id, shard_error_key, shard_output_key
from conveyor.jobs.line_caller import LineCaller, LineOutcome, LineResult
from conveyor.jobs.lines import Decoded, StopCode, custom_id_of, decode_line, stopped_record
from conveyor.jobs.planner import shard_requests
from conveyor.jobs.sink import ShardSink
from conveyor.jobs.stalls import is_outage
from conveyor.observability.logs import log_event
from conveyor.stores.errors import ObjectStoreError, StoreError
from conveyor.stores.records import BatchRecord, BatchStatus, ShardLease
from conveyor.tenants.usage import Payer, UsageTally

log = logging.getLogger(__name__)

Line = tuple[int, bytes]  # (0-based line number in the input file, raw line)
CACHE_FLUSH_ENTRIES = 64


class StopReason(enum.Enum):
    """Why an attempt stopped before running every line."""

    CANCELLED = "cancelled"
    EXPIRED = "expired"
    LOST_LEASE = "lost_lease"
    SHUTDOWN = "shutdown"


STOP_CODES = {StopReason.CANCELLED: StopCode.CANCELLED, StopReason.EXPIRED: StopCode.EXPIRED}


class AttemptOutcome(enum.Enum):
    """How an attempt ended."""

    COMMITTED = "committed"
    LOST = "lost"  # another attempt owns the shard now; nothing was committed
    INTERRUPTED = "interrupted"  # shutting down: the caller releases the shard


def stop_reason_for(batch: BatchRecord | None, now: float) -> StopReason | None:
    """Whether a running shard of `batch` must stop now, and why."""
    if batch is None:
        return StopReason.LOST_LEASE
    if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        return StopReason.CANCELLED
    if batch.status is BatchStatus.EXPIRED or (
        batch.expires_at is not None and batch.expires_at <= now
    ):
        return StopReason.EXPIRED
    if batch.status is BatchStatus.FAILED:
        return StopReason.LOST_LEASE
    return None


class ShardAttempt:
    """Runs the shard held by `lease` once; `run` returns how it ended."""

    def __init__(
        self, ctx: JobsContext, lease: ShardLease, batch: BatchRecord, shutdown: asyncio.Event
    ) -> None:
        """Prepare the attempt; nothing runs before `run`."""
        self._ctx = ctx
        self._lease = lease
        self._batch = batch
        self._shutdown = shutdown
        self._stop: StopReason | None = None
        self._stopped = asyncio.Event()
        self._sink = ShardSink()
        # The lines' usage, committed with their results (lost with them if not committed).
        self._usage = UsageTally()
        payer = Payer(batch.tenant, self._usage)
        self._lines = LineCaller(
            ctx.run_request, batch.endpoint, batch.id, ctx.retry, payer, sleep=ctx.sleep
        )
        # The batch's tenant's store: a pinned tenant's shards are read and written there.
        self._objects = ctx.objects.for_tenant(batch.tenant)
        self._checkpoints = PieceCheckpoints(self._objects, lease.batch_id, lease.index)
        self._cache = ResultCache(ctx.store) if ctx.config.result_cache else None
        self._cache_entries: list[tuple[str, bytes]] = []
        self._pieces: list[Piece] = []

    @property
    def is_isolating(self) -> bool:
        """Whether earlier attempts died often enough to bisect this shard.

        Never for a speculative run: it would share the original's piece checkpoints.
        """
        lease = self._lease
        return not lease.is_speculative and lease.attempt > self._ctx.config.isolate_after_attempts

    def _request_stop(self, reason: StopReason) -> None:
        """Stop launching lines (the first reason wins)."""
        if self._stop is None:
            self._stop = reason
            self._stopped.set()

    async def run(self) -> AttemptOutcome:
        """Run every line (or stop early), then commit unless interrupted."""
        try:
            lines = await asyncio.to_thread(self._load_lines)
            self._request_stop_if_needed(self._batch)
            heartbeat = asyncio.create_task(self._heartbeat(), name="conveyor-jobs-heartbeat")
            try:
                await self._run_plan(lines)
            finally:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat
            if self._stop is StopReason.LOST_LEASE:
                return AttemptOutcome.LOST
            if self._stop is StopReason.SHUTDOWN:
                return AttemptOutcome.INTERRUPTED
            await self._flush_cache()
            return await shielded(self._commit)
        finally:
            self._sink.close()

    def _load_lines(self) -> list[Line]:
        """The shard's request lines (blocking): at most one shard's bytes in memory."""
        lease = self._lease
        raw_lines = self._objects.read_lines(
            file_key(self._batch.input_file_id), lease.byte_start, lease.byte_end
        )
        lines = list(shard_requests(raw_lines, lease.first_line))
        if len(lines) != lease.num_lines:
            raise RuntimeError(
                f"shard {lease.index} of {lease.batch_id} holds {len(lines)} requests, "
                f"the plan says {lease.num_lines}"
            )
        return lines

    def _request_stop_if_needed(self, batch: BatchRecord | None) -> None:
        """Stop when the batch was cancelled, expired or vanished."""
        reason = stop_reason_for(batch, self._ctx.clock())
        if reason is not None:
            self._request_stop(reason)

    # -- heartbeat -------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Renew the lease, report progress and watch the batch until the attempt ends."""
        ctx = self._ctx
        while self._stop is None:
            if await wait_for_event(self._shutdown, ctx.config.renew_every_s):
                self._request_stop(StopReason.SHUTDOWN)
                return
            try:
                is_held = await asyncio.to_thread(self._renew_and_report)
                batch = await ctx.store.get_batch_any(self._lease.batch_id)
            except StoreError as exc:
                # A store hiccup is not the shard's fault: keep running, try again next beat;
                # if the lease lapses meanwhile, the fenced commit refuses our results.
                ctx.counters.store_error("job_store", "heartbeat")
                log.warning("heartbeat of shard %d of %s failed, will retry: %s",
                            self._lease.index, self._lease.batch_id, exc)  # fmt: skip
                continue
            if not is_held:
                lease = self._lease
                log_event(
                    log, logging.WARNING, "lease_lost",
                    f"lost the lease on shard {lease.index} of {lease.batch_id}",
                    batch_id=lease.batch_id, shard=lease.index, attempt=lease.attempt,
                )  # fmt: skip
                self._request_stop(StopReason.LOST_LEASE)
                return
            self._request_stop_if_needed(batch)

    def _renew_and_report(self) -> bool:
        """Extend the lease and publish progress; False once the lease is lost."""
        store, sink = self._ctx.store.blocking, self._sink
        if not store.renew_lease(self._lease, self._ctx.clock(), self._ctx.config.lease_s):
            return False
        return store.report_progress(self._lease, sink.num_completed, sink.num_failed)

    # -- running lines ---------------------------------------------------------------------

    async def _run_plan(self, lines: list[Line]) -> None:
        """Run the shard whole, or piece by piece when isolating a crashing line."""
        if not self.is_isolating:
            await self._run_lines(lines, self._sink)
            return
        plan = await asyncio.to_thread(
            plan_pieces, len(lines), self._checkpoints.probe, is_root_suspect=True
        )
        lease = self._lease
        log.warning(
            "isolating shard %d of %s in %d pieces (attempt %d)",
            lease.index, lease.batch_id, len(plan), lease.attempt,
        )  # fmt: skip
        self._pieces = [piece for piece, _ in plan]
        for piece, state in plan:
            await self._run_piece(piece, state, lines[piece.start : piece.end])

    async def _run_piece(self, piece: Piece, state: PieceState, lines: list[Line]) -> None:
        """Reuse a done piece, report an isolated line, or run a fresh piece durably."""
        if state is PieceState.DONE:
            await asyncio.to_thread(self._checkpoints.load_into, piece, self._sink)
        elif state is PieceState.CRASHED:
            line_no, raw = lines[0]
            record = stopped_record(
                line_id(self._batch.id, line_no), custom_id_of(decode_line(raw)), StopCode.ISOLATED
            )
            self._sink.add_failure(record)
            self._ctx.counters.line_done(LineOutcome.FAILED.value)
        elif self._stop is not None:
            self._record_not_run([(no, decode_line(raw)) for no, raw in lines], self._sink)
        else:
            await asyncio.to_thread(self._checkpoints.mark_started, piece)
            piece_sink = ShardSink()
            try:
                await self._run_lines(lines, piece_sink)
                if self._stop is None:
                    await asyncio.to_thread(self._checkpoints.save, piece, piece_sink)
                await asyncio.to_thread(_absorb, self._sink, piece_sink)
            except Exception as exc:
                if is_outage(exc):
                    # The storage failed, not a line: left in place, `started` would make
                    # the next attempt bisect the piece and blame innocent lines.
                    with contextlib.suppress(ObjectStoreError):
                        await asyncio.to_thread(self._checkpoints.unmark_started, piece)
                raise
            finally:
                piece_sink.close()

    async def _run_lines(self, lines: list[Line], sink: ShardSink) -> None:
        """Run `lines`, at most `max_lines_in_flight` at once; on a stop, record the rest.

        A fixed pool of workers pulls lines in order, so each line costs the event loop the
        same small bookkeeping whatever the window size.
        """
        decoded = [decode_line(raw) for _, raw in lines]
        feed = _LineFeed(lines, decoded, await self._lookup_cache(decoded))
        num_workers = min(self._ctx.config.max_lines_in_flight, len(lines))
        workers = [asyncio.ensure_future(self._work(feed, sink)) for _ in range(num_workers)]
        all_done = asyncio.gather(*workers)
        stop_waiter = asyncio.ensure_future(self._stopped.wait())
        try:
            waiting: set[asyncio.Future[Any]] = {all_done, stop_waiter}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if all_done.done():
                all_done.result()  # a worker's unexpected exception kills the attempt
        finally:
            stop_waiter.cancel()
            for worker in workers:
                worker.cancel()  # on a stop: lines still queued are dropped, never run
            await asyncio.gather(*workers, return_exceptions=True)
        self._record_not_run(feed.unfinished(), sink)

    async def _work(self, feed: _LineFeed, sink: ShardSink) -> None:
        """One worker: run the next line until none is left or the attempt stops."""
        while self._stop is None and (index := feed.take()) is not None:
            line_no, _ = feed.lines[index]
            key, hit = feed.cached[index]
            result = await self._lines.run(line_no, feed.decoded[index], cached=hit, key=key)
            feed.finish(index)
            await self._collect(result, sink)

    async def _collect(self, result: LineResult, sink: ShardSink) -> None:
        """File a finished line's record and count it."""
        counters = self._ctx.counters
        if result.outcome is LineOutcome.COMPLETED:
            sink.add_output(result.record)
        else:
            sink.add_failure(result.record)
        counters.line_done(result.outcome.value)
        if result.is_cache_hit:
            counters.cache_hit()
        if result.cache_entry is not None:
            self._cache_entries.append(result.cache_entry)
            if len(self._cache_entries) >= CACHE_FLUSH_ENTRIES:
                await self._flush_cache()

    def _record_not_run(self, lines: Sequence[tuple[int, Decoded]], sink: ShardSink) -> None:
        """Give each line that never ran its `batch_cancelled` / `batch_expired` record."""
        code = STOP_CODES.get(self._stop) if self._stop is not None else None
        if code is None:
            return  # lost lease or shutdown: nothing is committed, so nothing is recorded
        for line_no, decoded in lines:
            sink.add_not_run(
                stopped_record(line_id(self._batch.id, line_no), custom_id_of(decoded), code)
            )

    # -- result cache ----------------------------------------------------------------------

    async def _lookup_cache(self, decoded: list[Decoded]) -> list[tuple[str | None, bytes | None]]:
        """Each line's cache key and cached body (all None when the cache is off)."""
        if self._cache is None:
            return [(None, None)] * len(decoded)
        tenant, endpoint = self._batch.tenant, self._batch.endpoint
        keys = [
            None if isinstance(line, ValueError) else cache_key(tenant, endpoint, line.body)
            for line in decoded
        ]
        hits = await self._cache.get_many(keys)
        return list(zip(keys, hits, strict=True))

    async def _flush_cache(self) -> None:
        """Store computed bodies for future batches."""
        if self._cache is None or not self._cache_entries:
            self._cache_entries.clear()
            return
        entries, self._cache_entries = self._cache_entries, []
        await self._cache.put_many(entries)

    # -- commit ----------------------------------------------------------------------------

    async def _commit(self) -> AttemptOutcome:
        """Write the attempt's objects and commit them while the lease is held."""
        return await asyncio.to_thread(self._write_and_commit)

    def _write_and_commit(self) -> AttemptOutcome:
        """Blocking: objects under this attempt's keys, then the fenced commit."""
        ctx, lease, sink = self._ctx, self._lease, self._sink
        if sink.num_recorded != lease.num_lines:
            raise RuntimeError(
                f"shard {lease.index} of {lease.batch_id}: {sink.num_recorded} records for "
                f"{lease.num_lines} lines"
            )
        is_spec = lease.is_speculative
        output_key = shard_output_key(lease.batch_id, lease.index, lease.attempt, is_spec)
        error_key = shard_error_key(lease.batch_id, lease.index, lease.attempt, is_spec)
        keys = {output_key: sink.outputs, error_key: sink.errors}
        written = {key: spool for key, spool in keys.items() if spool.num_records}
        for key, spool in written.items():
            self._objects.put_stream(key, spool.chunks())
        store = ctx.store.blocking
        is_held = store.renew_lease(lease, ctx.clock(), ctx.config.lease_s)
        if not is_held or not store.commit_shard(
            lease,
            ctx.clock(),
            output_key if output_key in written else None,
            error_key if error_key in written else None,
            sink.num_completed,
            sink.num_failed,
            usage=self._usage.peek(),
        ):
            for key in written:
                self._objects.delete(key)
            return AttemptOutcome.LOST
        if self._pieces:
            self._checkpoints.delete(self._pieces)
        return AttemptOutcome.COMMITTED


class _LineFeed:
    """Hands out a list of lines in order and knows which never finished."""

    def __init__(
        self,
        lines: list[Line],
        decoded: list[Decoded],
        cached: list[tuple[str | None, bytes | None]],
    ) -> None:
        self.lines = lines
        self.decoded = decoded
        self.cached = cached
        self._next = 0
        self._running: set[int] = set()

    def take(self) -> int | None:
        """The index of the next line to run, or None when all were handed out."""
        if self._next >= len(self.lines):
            return None
        index = self._next
        self._next += 1
        self._running.add(index)
        return index

    def finish(self, index: int) -> None:
        """A line has its result."""
        self._running.discard(index)

    def unfinished(self) -> list[tuple[int, Decoded]]:
        """Lines started but not finished, then lines never handed out, in file order."""
        indexes = [*sorted(self._running), *range(self._next, len(self.lines))]
        return [(self.lines[i][0], self.decoded[i]) for i in indexes]


def _absorb(target: ShardSink, source: ShardSink) -> None:
    """Append every record and count of `source` to `target` (blocking copy)."""
    target.outputs.add_chunks(source.outputs.chunks(), source.outputs.num_records)
    target.errors.add_chunks(source.errors.chunks(), source.errors.num_records)
    target.num_completed += source.num_completed
    target.num_failed += source.num_failed
