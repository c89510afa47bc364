"""File and batch operations behind the HTTP API, scoped to the caller's tenant.

Another tenant's file or batch is answered exactly like a missing one (404), so ids leak
nothing. Store calls run in a worker thread (see `jobs.store`), object store deletes too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

from conveyor.errors import InvalidRequest, NotFound
from conveyor.jobs.context import JobsContext
from conveyor.jobs.errors import BatchNotCancellable
from conveyor.jobs.expiry import expires_at, form_expires_after, parse_expires_after
from conveyor.jobs.keys import file_key
from conveyor.jobs.leases import ACTIVE_BATCH_STATUSES, TERMINAL_BATCH_STATUSES
from conveyor.jobs.upload import store_stream
from conveyor.jobs.validation import check_endpoint, check_metadata, parse_completion_window
from conveyor.stores.protocols import MAX_BATCHES_PAGE, MAX_FILES_PAGE, ListOrder
from conveyor.stores.records import (
    BatchRecord,
    BatchStatus,
    FileRecord,
    new_batch_id,
    new_file_id,
)

BATCH_PURPOSE = "batch"
DEFAULT_BATCHES_PAGE = 20
CANCELLABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


class UploadForm(Protocol):
    """The parsed form of an upload (available once its file has streamed)."""

    @property
    def fields(self) -> dict[str, str]:
        """Form fields other than the file."""
        ...

    @property
    def filename(self) -> str | None:
        """The file part's filename."""
        ...


def check_limit(limit: int | None, default: int, maximum: int) -> int:
    """A page size in `1..maximum` (400 otherwise)."""
    if limit is None:
        return default
    if not 1 <= limit <= maximum:
        raise InvalidRequest(f"limit must be between 1 and {maximum}", param="limit")
    return limit


def check_order(order: str | None) -> ListOrder:
    """A list's `order`: `desc` (the default) or `asc` (400 otherwise)."""
    if order is None or order == "desc":
        return "desc"
    if order == "asc":
        return "asc"
    raise InvalidRequest(f"order must be 'asc' or 'desc', got {order!r}", param="order")


class JobOperations:
    """What `/v1/files` and `/v1/batches` do, independent of HTTP."""

    def __init__(self, ctx: JobsContext, kick: Callable[[], None]) -> None:
        """`kick` wakes the supervisor (a batch was created or cancelled)."""
        self._ctx = ctx
        self._kick = kick

    # -- files -----------------------------------------------------------------------------

    def check_upload_fields(self, fields: dict[str, str]) -> None:
        """Refuse an upload whose form fields are wrong (400), e.g. before its file streams."""
        purpose = fields.get("purpose")
        if purpose is not None and purpose != BATCH_PURPOSE:
            raise InvalidRequest(f"purpose must be {BATCH_PURPOSE!r}", param="purpose")

    def _lifetime_s(self, value: object, param: str) -> int | None:
        """A file lifetime from an `expires_after`-shaped value, within the configured bounds."""
        cfg = self._ctx.config
        return parse_expires_after(
            value, param=param, min_s=cfg.min_expires_after_s, max_s=cfg.max_expires_after_s
        )

    async def upload_file(
        self, tenant: str, chunks: AsyncIterator[bytes], form: UploadForm
    ) -> FileRecord:
        """Stream a file into the object store, then record it once the form checks out."""
        ctx = self._ctx
        file_id = new_file_id()
        key = file_key(file_id)
        objects = ctx.objects.for_tenant(tenant)
        num_bytes = await store_stream(objects, key, chunks, ctx.config.max_file_bytes)
        try:
            if "purpose" not in form.fields:
                raise InvalidRequest("missing required parameter: 'purpose'", param="purpose")
            self.check_upload_fields(form.fields)
            # Checked once every field is in: its two parts may come before or after the file.
            lifetime_s = self._lifetime_s(form_expires_after(form.fields), "expires_after")
            created_at = int(ctx.clock())
            record = FileRecord(
                id=file_id, tenant=tenant, filename=form.filename or "upload.jsonl",
                purpose=BATCH_PURPOSE, bytes=num_bytes, created_at=created_at,
                object_key=key, expires_at=expires_at(created_at, lifetime_s),
            )  # fmt: skip
            await ctx.store.create_file(record)
        except BaseException:
            await asyncio.to_thread(objects.delete, key)
            raise
        return record

    async def list_files(
        self,
        tenant: str,
        *,
        purpose: str | None,
        after: str | None,
        limit: int | None,
        order: str | None = None,
    ) -> tuple[list[FileRecord], bool]:
        """One page of the tenant's files (newest first unless `asc`), and whether more follow."""
        size = check_limit(limit, MAX_FILES_PAGE, MAX_FILES_PAGE)
        direction = check_order(order)
        # One extra row tells whether another page exists; the store caps a page at the max.
        ask = min(size + 1, MAX_FILES_PAGE)
        rows = await self._ctx.store.list_files(tenant, purpose, after, ask, order=direction)
        return rows[:size], len(rows) > size

    async def get_file(self, tenant: str, file_id: str) -> FileRecord:
        """The tenant's file, or 404."""
        record = await self._ctx.store.get_file(tenant, file_id)
        if record is None:
            raise NotFound(f"no file with id {file_id!r}", param="file_id")
        return record

    async def file_content(self, tenant: str, file_id: str) -> tuple[FileRecord, Iterator[bytes]]:
        """The file and a (blocking) iterator over its bytes."""
        record = await self.get_file(tenant, file_id)
        return record, self._ctx.objects.for_tenant(tenant).iter_chunks(record.object_key)

    async def delete_file(self, tenant: str, file_id: str) -> None:
        """Delete the file; its bytes stay while an unfinished batch still reads them."""
        ctx = self._ctx
        record = await self.get_file(tenant, file_id)
        await ctx.store.delete_file(tenant, file_id)
        active = await ctx.store.batches_in_status(ACTIVE_BATCH_STATUSES)
        if all(batch.input_file_id != file_id for batch in active):
            await asyncio.to_thread(ctx.objects.for_tenant(tenant).delete, record.object_key)

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(self, tenant: str, params: dict[str, Any]) -> BatchRecord:
        """Check the parameters and the input file, then record a `validating` batch."""
        cfg = self._ctx.config
        endpoint = check_endpoint(params.get("endpoint"))
        window = params.get("completion_window")
        window_s = parse_completion_window(
            window,
            min_s=cfg.min_completion_window_s,
            max_s=cfg.max_completion_window_s,
        )
        metadata = check_metadata(params.get("metadata"))
        output_lifetime_s = self._lifetime_s(
            params.get("output_expires_after"), "output_expires_after"
        )
        input_file_id = params.get("input_file_id")
        if not isinstance(input_file_id, str) or not input_file_id:
            raise InvalidRequest("input_file_id must be a file id", param="input_file_id")
        source = await self.get_file(tenant, input_file_id)
        if source.purpose != BATCH_PURPOSE:
            raise InvalidRequest(
                f"file {input_file_id} has purpose {source.purpose!r}, not 'batch'",
                param="input_file_id",
            )
        now = self._ctx.clock()
        record = BatchRecord(
            id=new_batch_id(), tenant=tenant, endpoint=endpoint, input_file_id=input_file_id,
            completion_window=str(window), created_at=int(now), expires_at=int(now + window_s),
            metadata=metadata, output_expires_after_s=output_lifetime_s,
        )  # fmt: skip
        await self._ctx.store.create_batch(record)
        self._kick()
        return await self.get_batch(tenant, record.id)

    async def get_batch(self, tenant: str, batch_id: str) -> BatchRecord:
        """The tenant's batch with live request counts, or 404."""
        record = await self._ctx.store.get_batch(tenant, batch_id)
        if record is None:
            raise NotFound(f"no batch with id {batch_id!r}", param="batch_id")
        return record

    async def list_batches(
        self, tenant: str, *, after: str | None, limit: int | None, order: str | None = None
    ) -> tuple[list[BatchRecord], bool]:
        """One page of the tenant's batches (newest first unless `asc`), and whether more
        follow."""
        size = check_limit(limit, DEFAULT_BATCHES_PAGE, MAX_BATCHES_PAGE)
        direction = check_order(order)
        ask = min(size + 1, MAX_BATCHES_PAGE)
        rows = await self._ctx.store.list_batches(tenant, after, ask, order=direction)
        return rows[:size], len(rows) > size

    async def cancel_batch(self, tenant: str, batch_id: str) -> BatchRecord:
        """Start cancelling; finished lines are kept. Cancelling twice is harmless."""
        record = await self.get_batch(tenant, batch_id)
        if record.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return record
        if record.status in TERMINAL_BATCH_STATUSES or record.status is BatchStatus.FINALIZING:
            raise BatchNotCancellable(
                f"batch {batch_id} is {record.status.value} and cannot be cancelled"
            )
        await self._ctx.store.transition(
            batch_id, CANCELLABLE, BatchStatus.CANCELLING, self._ctx.clock()
        )
        self._kick()
        return await self.get_batch(tenant, batch_id)
