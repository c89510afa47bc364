"""Finalizing a batch: gather the shards' records into the output and error files.

A batch is finalized from `finalizing` (every shard done, or the window expired) or from
`cancelling`. Nothing is assembled while a live lease remains: its holder is still committing
what it finished. Leases that expired (their holder died) are released, so no late commit can
slip in. Then:

- the output file is every committed shard's output, in shard order;
- the error file is every committed shard's errors, plus a `batch_cancelled` /
  `batch_expired` record for each line of a shard that never committed;
- the batch moves to `completed` (every line has a result), `expired` or `cancelled`.

File ids derive from the batch id and every record is deterministic, so two finalizers
(processes racing, or a retry after a crash) write the same files and only one transition
wins. Blocking throughout: call from a thread.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence

from conveyor.jobs.context import JobsContext
from conveyor.jobs.keys import error_file_id, file_key, line_id, output_file_id
from conveyor.jobs.leases import ACTIVE_BATCH_STATUSES, is_live
from conveyor.jobs.lines import StopCode, custom_id_of, decode_line, stopped_record
from conveyor.jobs.planner import shard_requests
from conveyor.jobs.stalls import without_stall_notes
from conveyor.jobs.store import transition
from conveyor.stores.errors import ObjectStoreError
from conveyor.stores.protocols import BatchStore
from conveyor.stores.records import (
    BatchRecord,
    BatchStatus,
    FileRecord,
    ShardLease,
    ShardRecord,
    ShardStatus,
)

log = logging.getLogger(__name__)

OUTPUT_PURPOSE = "batch_output"
FINALIZABLE = (BatchStatus.FINALIZING, BatchStatus.CANCELLING)


def final_status(status: BatchStatus, shards: Sequence[ShardRecord]) -> BatchStatus:
    """Where a finalizable batch ends: cancelled, completed (all lines ran) or expired."""
    if status is BatchStatus.CANCELLING:
        return BatchStatus.CANCELLED
    if status is not BatchStatus.FINALIZING:
        raise ValueError(f"cannot finalize a batch in status {status}")
    is_done = all(s.status is ShardStatus.DONE for s in shards)
    num_ran = sum(s.num_completed + s.num_failed for s in shards)
    return (
        BatchStatus.COMPLETED
        if is_done and num_ran == sum(s.num_lines for s in shards)
        else (BatchStatus.EXPIRED)
    )


def stop_code_for(status: BatchStatus) -> StopCode:
    """The error code of lines that never ran in a batch ending in `status`."""
    return StopCode.CANCELLED if status is BatchStatus.CANCELLED else StopCode.EXPIRED


def is_input_in_use(store: BatchStore, file_id: str) -> bool:
    """Blocking: whether a batch that has not finished yet reads the file `file_id`."""
    active = store.batches_in_status(ACTIVE_BATCH_STATUSES)
    return any(b.input_file_id == file_id for b in active)


class Finalizer:
    """Finalizes batches of one job store and object store."""

    def __init__(self, ctx: JobsContext) -> None:
        """Use the stores and clock of `ctx`."""
        self._ctx = ctx

    def try_finalize(self, batch: BatchRecord) -> bool:
        """Finalize `batch` if no live lease remains; True when this call finished it."""
        if batch.status not in FINALIZABLE:
            raise ValueError(f"cannot finalize a batch in status {batch.status}")
        store = self._ctx.store.blocking
        current = store.get_batch_any(batch.id)
        if current is None or current.status is not batch.status:
            return False  # someone else moved it on
        shards = self._settled_shards(batch.id)
        if shards is None:
            return False
        target = final_status(batch.status, shards)
        code = stop_code_for(target)
        out_id = self._write_file(
            batch, output_file_id(batch.id), self._outputs(batch, shards), "output"
        )
        err_id = self._write_file(
            batch, error_file_id(batch.id), self._errors(batch, shards, code), "errors"
        )
        fields: dict[str, object] = {"output_file_id": out_id, "error_file_id": err_id}
        if current.errors:
            fields["errors"] = without_stall_notes(current.errors)  # the stall is over
        is_won = transition(store, batch.id, [batch.status], target, self._ctx.clock(), **fields)
        if is_won:
            self._clean_up(batch, shards)
        return is_won

    def _settled_shards(self, batch_id: str) -> list[ShardRecord] | None:
        """The shards once none is leased (expired leases are released); None to wait."""
        store, now = self._ctx.store.blocking, self._ctx.clock()
        shards = store.list_shards(batch_id)
        leased = [s for s in shards if s.status is ShardStatus.LEASED]
        if any(is_live(s.lease_expires_at, now) for s in leased):
            return None
        for shard in leased:
            if not store.release_shard(ShardLease.of_shard(shard)):
                return None  # it changed meanwhile; look again next time
        return store.list_shards(batch_id) if leased else shards

    def _outputs(self, batch: BatchRecord, shards: Sequence[ShardRecord]) -> Iterator[bytes] | None:
        """The output file's bytes, or None when no request succeeded."""
        keys = [s.output_key for s in shards if s.status is ShardStatus.DONE and s.output_key]
        if not keys:
            return None
        objects = self._ctx.objects.for_tenant(batch.tenant)
        return itertools.chain.from_iterable(objects.iter_chunks(key) for key in keys)

    def _errors(
        self, batch: BatchRecord, shards: Sequence[ShardRecord], code: StopCode
    ) -> Iterator[bytes] | None:
        """The error file's bytes, or None when there is nothing to report."""
        parts = [s for s in shards if (s.status is ShardStatus.DONE and s.error_key) or (
            s.status is not ShardStatus.DONE and s.num_lines > 0)]  # fmt: skip
        if not parts:
            return None
        return itertools.chain.from_iterable(self._shard_errors(batch, s, code) for s in parts)

    def _shard_errors(
        self, batch: BatchRecord, shard: ShardRecord, code: StopCode
    ) -> Iterator[bytes]:
        """A done shard's error object, or a not-run record for each line of any other shard."""
        objects = self._ctx.objects.for_tenant(batch.tenant)
        if shard.status is ShardStatus.DONE and shard.error_key:
            yield from objects.iter_chunks(shard.error_key)
            return
        key = file_key(batch.input_file_id)
        if not objects.exists(key):
            # The input is gone (it cannot be while a batch reads it, unless removed by hand):
            # still one record per line, without custom_ids, so the batch can end.
            for offset in range(shard.num_lines):
                yield stopped_record(line_id(batch.id, shard.first_line + offset), None, code)
            return
        lines = objects.read_lines(key, shard.byte_start, shard.byte_end)
        for line_no, raw in shard_requests(lines, shard.first_line):
            yield stopped_record(line_id(batch.id, line_no), custom_id_of(decode_line(raw)), code)

    def _write_file(
        self, batch: BatchRecord, file_id: str, chunks: Iterator[bytes] | None, kind: str
    ) -> str | None:
        """Write a result file (object, then record) unless it has no content."""
        if chunks is None:
            return None
        key = file_key(file_id)
        num_bytes = self._ctx.objects.for_tenant(batch.tenant).put_stream(key, chunks)
        store = self._ctx.store.blocking
        if store.get_file(batch.tenant, file_id) is None:
            created_at = int(self._ctx.clock())
            lifetime_s = batch.output_expires_after_s  # `output_expires_after`, from creation
            record = FileRecord(
                id=file_id, tenant=batch.tenant, filename=f"{batch.id}_{kind}.jsonl",
                purpose=OUTPUT_PURPOSE, bytes=num_bytes, created_at=created_at, object_key=key,
                expires_at=None if lifetime_s is None else created_at + lifetime_s,
            )  # fmt: skip
            store.create_file(record)
        return file_id

    def _clean_up(self, batch: BatchRecord, shards: Sequence[ShardRecord]) -> None:
        """Drop shard objects (now copied) and an input file deleted while the batch ran."""
        objects = self._ctx.objects.for_tenant(batch.tenant)
        with contextlib.suppress(ObjectStoreError):
            for shard in shards:
                for key in (shard.output_key, shard.error_key):
                    if key:
                        objects.delete(key)
            store = self._ctx.store.blocking
            if store.get_file(batch.tenant, batch.input_file_id) is None and not is_input_in_use(
                store, batch.input_file_id
            ):
                objects.delete(file_key(batch.input_file_id))
