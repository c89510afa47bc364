"""Anthropic's Message Batches on the Batch API's machinery, scoped to the caller's tenant.

Creating one writes its requests as a batch input file (``message_batch_input``, a file of
purpose ``message_batch``) and records a batch over it for ``/v1/messages``: from then on it
is planned into shards, claimed by fair share, run exactly once and finalized like any
batch. Results are the output and error files' records read back as Anthropic's result
lines (``message_batch_views``); a batch that ended before it was planned (cancelled at
once, or failed) has its requests' results made from the input file, which is kept until
the batch is deleted. Another tenant's batch, or an OpenAI batch, is a 404 here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from conveyor.errors import InvalidRequest, NotFound
from conveyor.jobs.context import JobsContext
from conveyor.jobs.keys import file_key
from conveyor.jobs.lines import custom_id_of, decode_line
from conveyor.jobs.message_batch_input import BatchInput, batch_input, max_requests_of
from conveyor.jobs.message_batch_views import (
    REQUESTS_KEY,
    internal_id,
    is_ended,
    public_id,
    result_line,
    unplanned_result,
)
from conveyor.jobs.operations import CANCELLABLE, check_limit
from conveyor.openai_paths import MESSAGES
from conveyor.stores.errors import ObjectNotFoundError
from conveyor.stores.object_io import lines_of
from conveyor.stores.protocols import MAX_BATCHES_PAGE, ListOrder
from conveyor.stores.records import (
    BatchRecord,
    BatchStatus,
    FileRecord,
    new_batch_id,
    new_file_id,
)

__all__ = ["MessageBatches"]

INPUT_PURPOSE = "message_batch"
COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600
DEFAULT_PAGE = 20
MAX_PAGE = 1000  # Anthropic's bound; a page holds at most the store's `MAX_BATCHES_PAGE`


class MessageBatches:
    """What ``/v1/messages/batches`` does, independent of HTTP."""

    def __init__(self, ctx: JobsContext, kick: Callable[[], None]) -> None:
        """`kick` wakes the supervisor (a batch was created or cancelled)."""
        self._ctx = ctx
        self._kick = kick

    async def create(self, tenant: str, body: bytes) -> BatchRecord:
        """Write the requests as an input file and record a batch over it (400 if bad)."""
        ctx = self._ctx
        limit = max_requests_of(ctx.config, MESSAGES)
        planned = await asyncio.to_thread(batch_input, body, max_requests=limit)
        if not ctx.is_model_served(planned.model):
            raise InvalidRequest(f"the model {planned.model!r} is not served here",
                                 param="requests[0].params.model")  # fmt: skip
        record = await self._record(tenant, planned)
        self._kick()
        return await self.get(tenant, record.id)

    async def _record(self, tenant: str, planned: BatchInput) -> BatchRecord:
        """Store the input file (bytes, then record), then the batch; the file goes if the
        batch cannot be recorded."""
        ctx = self._ctx
        file_id, batch_id = new_file_id(), new_batch_id()
        key = file_key(file_id)
        objects = ctx.objects.for_tenant(tenant)
        num_bytes = await asyncio.to_thread(objects.put_stream, key, iter(planned.lines))
        now = int(ctx.clock())
        source = FileRecord(
            id=file_id, tenant=tenant, filename=f"{public_id(batch_id)}_requests.jsonl",
            purpose=INPUT_PURPOSE, bytes=num_bytes, created_at=now, object_key=key,
        )  # fmt: skip
        record = BatchRecord(
            id=batch_id, tenant=tenant, endpoint=MESSAGES, input_file_id=file_id,
            completion_window=COMPLETION_WINDOW, created_at=now,
            expires_at=now + COMPLETION_WINDOW_S,
            metadata={REQUESTS_KEY: str(planned.num_requests)},
        )  # fmt: skip
        try:
            await ctx.store.create_file(source)
            await ctx.store.create_batch(record)
        except BaseException:
            await asyncio.to_thread(self._delete_file, tenant, file_id)
            raise
        return record

    async def get(self, tenant: str, message_batch_id: str) -> BatchRecord:
        """The tenant's message batch (by its ``msgbatch_`` or batch id), or 404."""
        batch_id = internal_id(message_batch_id) or message_batch_id
        record = await self._ctx.store.get_batch(tenant, batch_id)
        if record is None or record.endpoint != MESSAGES:
            raise NotFound(f"no message batch with id {message_batch_id!r}")
        return record

    async def list_page(
        self, tenant: str, *, limit: int | None, after_id: str | None, before_id: str | None
    ) -> tuple[list[BatchRecord], bool]:
        """One page, newest first: after ``after_id`` (older), or before ``before_id`` (newer)."""
        size = min(check_limit(limit, DEFAULT_PAGE, MAX_PAGE), MAX_BATCHES_PAGE)
        if after_id is not None and before_id is not None:
            raise InvalidRequest("give after_id or before_id, not both", param="before_id")
        cursor = before_id if before_id is not None else after_id
        after = None if cursor is None else internal_id(cursor) or cursor
        order: ListOrder = "asc" if before_id is not None else "desc"
        ask = min(size + 1, MAX_BATCHES_PAGE)
        rows = await self._ctx.store.list_batches(
            tenant, after, ask, order=order, endpoint=MESSAGES
        )
        page = rows[:size]
        return (page[::-1] if before_id is not None else page), len(rows) > size

    async def cancel(self, tenant: str, message_batch_id: str) -> BatchRecord:
        """Start cancelling: requests that finished keep their results, the rest are
        ``canceled``. A batch that has ended (or is ending) is returned as it is."""
        record = await self.get(tenant, message_batch_id)
        if record.status not in CANCELLABLE:
            return record
        # From either status: the supervisor may plan a validating batch (validating ->
        # in_progress) between the read above and this write, and the cancel must still hold.
        ctx = self._ctx
        await ctx.store.transition(record.id, CANCELLABLE, BatchStatus.CANCELLING, ctx.clock())
        self._kick()
        return await self.get(tenant, record.id)

    async def delete(self, tenant: str, message_batch_id: str) -> str:
        """Delete an ended batch and its files; its ``msgbatch_`` id."""
        record = await self.get(tenant, message_batch_id)
        if not is_ended(record.status):
            raise InvalidRequest(
                "a message batch can be deleted only once it has ended; cancel it first"
            )
        await self._ctx.store.delete_batch(tenant, record.id)
        await asyncio.to_thread(self._delete_files, record)
        return record.id

    def _delete_files(self, record: BatchRecord) -> None:
        """Blocking: the batch's input and result files (records and bytes)."""
        for file_id in (record.input_file_id, record.output_file_id, record.error_file_id):
            if file_id is not None:
                self._delete_file(record.tenant, file_id)

    def _delete_file(self, tenant: str, file_id: str) -> None:
        """Blocking: a file's record and bytes."""
        self._ctx.store.blocking.delete_file(tenant, file_id)
        self._ctx.objects.for_tenant(tenant).delete(file_key(file_id))

    async def results(self, tenant: str, message_batch_id: str) -> Iterator[bytes]:
        """A (blocking) iterator over the batch's result lines; 400 before it has ended."""
        record = await self.get(tenant, message_batch_id)
        if not is_ended(record.status):
            raise InvalidRequest(
                f"message batch {message_batch_id!r} has not ended yet: its results are "
                "available once processing_status is 'ended'"
            )
        return self._result_lines(record)

    def _result_lines(self, record: BatchRecord) -> Iterator[bytes]:
        """The result lines: from the result files, or, for a batch that ended before it
        was planned, one line per request of its input."""
        objects = self._ctx.objects.for_tenant(record.tenant)
        if record.request_counts.total == 0:
            with contextlib.suppress(ObjectNotFoundError):
                for raw in lines_of(objects.iter_chunks(file_key(record.input_file_id))):
                    custom_id = _custom_id(raw)
                    if custom_id is not None:
                        yield unplanned_result(record, custom_id)
            return
        for file_id in (record.output_file_id, record.error_file_id):
            if file_id is None:
                continue
            for raw in lines_of(objects.iter_chunks(file_key(file_id))):
                line = result_line(raw) if raw.strip() else None
                if line is not None:
                    yield line


def _custom_id(raw: bytes) -> str | None:
    """The custom_id of an input line this module wrote."""
    return custom_id_of(decode_line(raw)) if raw.strip() else None
