"""In-memory job store and worker registry: files, batches, cache, workers, shards, keys, usage,
stored responses."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from conveyor.fakes.api_keys import MemoryApiKeys
from conveyor.fakes.models import MemoryModels
from conveyor.fakes.responses import MemoryResponses
from conveyor.fakes.shards import MemoryShards, op
from conveyor.fakes.usage import MemoryUsage
from conveyor.stores.errors import StoreError
from conveyor.stores.protocols import MAX_BATCHES_PAGE, MAX_FILES_PAGE, ListOrder
from conveyor.stores.records import (
    STATUS_TIMESTAMP_FIELD,
    BatchRecord,
    BatchStatus,
    BatchUsage,
    FileRecord,
    RequestCounts,
    WorkerRecord,
)
from conveyor.stores.sql_files import encode_batch_fields

_T = TypeVar("_T")


class MemoryJobStore(MemoryResponses, MemoryApiKeys, MemoryUsage, MemoryShards, MemoryModels):
    """Job store and worker registry in dictionaries; thread-safe, one lock for everything."""

    # -- files -----------------------------------------------------------------------------

    @op
    def create_file(self, rec: FileRecord) -> None:
        """Insert a file record; a second record with its id is refused."""
        if rec.id in self._files:
            raise StoreError(f"file {rec.id} exists")
        self._files[rec.id] = (next(self._seq), rec)

    @op
    def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        """The tenant's file, or None."""
        _, rec = self._files.get(file_id, (0, None))
        return rec if rec is not None and rec.tenant == tenant else None

    @op
    def list_files(
        self,
        tenant: str,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = MAX_FILES_PAGE,
        *,
        order: ListOrder = "desc",
    ) -> list[FileRecord]:
        """The tenant's files newest first (oldest first for `asc`), after the file id `after`."""
        rows = [(seq, r) for seq, r in self._files.values() if r.tenant == tenant]
        rows = [(seq, r) for seq, r in rows if purpose is None or r.purpose == purpose]
        return _page(rows, after, limit, MAX_FILES_PAGE, is_ascending=order == "asc")

    @op
    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file record; whether it existed."""
        if self.get_file(tenant, file_id) is None:
            return False
        del self._files[file_id]
        return True

    @op
    def expired_files(self, now: float, limit: int) -> list[FileRecord]:
        """Files of any tenant whose `expires_at` is at or before `now`, soonest first."""
        if not 1 <= limit <= MAX_FILES_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_FILES_PAGE}, got {limit}")
        rows = [(r.expires_at, seq, r) for seq, r in self._files.values()]
        due = sorted(row for row in rows if row[0] is not None and row[0] <= int(now))
        return [r for _, _, r in due[:limit]]

    # -- batches ---------------------------------------------------------------------------

    @op
    def create_batch(self, rec: BatchRecord) -> None:
        """Insert a batch; a second batch with its id is refused."""
        if rec.id in self._batches:
            raise StoreError(f"batch {rec.id} exists")
        self._batches[rec.id] = (next(self._seq), rec)

    @op
    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """The tenant's batch, or None."""
        rec = self.get_batch_any(batch_id)
        return rec if rec is not None and rec.tenant == tenant else None

    @op
    def get_batch_any(self, batch_id: str) -> BatchRecord | None:
        """A batch regardless of tenant, with request counts summed from its shards."""
        if batch_id not in self._batches:
            return None
        rows = list(self._shards.get(batch_id, {}).values())
        shards = [row.record for row in rows]
        counts = RequestCounts(
            total=sum(s.num_lines for s in shards),
            completed=sum(s.num_completed for s in shards),
            failed=sum(s.num_failed for s in shards),
        )
        usage = BatchUsage(
            sum(row.input_tokens for row in rows), sum(row.output_tokens for row in rows)
        )
        peak = RequestCounts(
            total=counts.total,
            completed=sum(row.peak_completed for row in rows),
            failed=sum(row.peak_failed for row in rows),
        )
        rec = self._batches[batch_id][1]
        return dataclasses.replace(rec, request_counts=counts, usage=usage, peak_counts=peak)

    @op
    def list_batches(
        self,
        tenant: str,
        after: str | None = None,
        limit: int = 20,
        *,
        order: ListOrder = "desc",
        endpoint: str | None = None,
    ) -> list[BatchRecord]:
        """The tenant's batches newest first (oldest first for `asc`), after the id `after`;
        with `endpoint`, only that endpoint's."""
        rows = [(seq, r) for seq, r in self._batches.values() if r.tenant == tenant]
        rows = [(seq, r) for seq, r in rows if endpoint is None or r.endpoint == endpoint]
        page = _page(rows, after, limit, MAX_BATCHES_PAGE, is_ascending=order == "asc")
        return [b for b in (self.get_batch_any(r.id) for r in page) if b is not None]

    @op
    def delete_batch(self, tenant: str, batch_id: str) -> bool:
        """Delete the tenant's batch and its shards; whether it existed."""
        current = self._batches.get(batch_id)
        if current is None or current[1].tenant != tenant:
            return False
        del self._batches[batch_id]
        self._shards.pop(batch_id, None)
        return True

    @op
    def transition(
        self,
        batch_id: str,
        from_statuses: Iterable[BatchStatus],
        to_status: BatchStatus,
        now: float,
        **fields: object,
    ) -> bool:
        """Compare-and-set the status, stamp `*_at` with `int(now)`, apply `fields`."""
        sources = [BatchStatus(s) for s in from_statuses]
        if not sources:
            raise ValueError("transition needs at least one from-status")
        changes = _batch_changes(fields)
        current = self._batches.get(batch_id)
        if current is None or current[1].status not in sources:
            return False
        changes |= {"status": BatchStatus(to_status)}
        changes[STATUS_TIMESTAMP_FIELD[BatchStatus(to_status)]] = int(now)
        self._batches[batch_id] = (current[0], dataclasses.replace(current[1], **changes))
        return True

    @op
    def update_batch_fields(self, batch_id: str, **fields: object) -> bool:
        """Update non-status fields of a batch; whether it exists."""
        changes = _batch_changes(fields)
        if not changes:
            raise ValueError("update_batch_fields needs at least one field")
        if batch_id not in self._batches:
            return False
        seq, rec = self._batches[batch_id]
        self._batches[batch_id] = (seq, dataclasses.replace(rec, **changes))
        return True

    @op
    def batches_in_status(self, statuses: Iterable[BatchStatus]) -> list[BatchRecord]:
        """Every batch in one of `statuses`, oldest first."""
        wanted = {BatchStatus(s) for s in statuses}
        ids = [r.id for _, r in sorted(self._batches.values(), key=lambda x: x[0])]
        found = [self.get_batch_any(i) for i in ids]
        return [b for b in found if b is not None and b.status in wanted]

    # -- cache and registry ----------------------------------------------------------------

    @op
    def cache_get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The cached value of each key that has one."""
        return {key: self._cache[key] for key in keys if key in self._cache}

    @op
    def cache_put_many(self, entries: Mapping[str, bytes]) -> None:
        """Store values under their keys; present keys keep their value."""
        if any(not key for key in entries):
            raise ValueError("cache key must be a non-empty string")
        for key, value in entries.items():
            self._cache.setdefault(key, bytes(value))

    @op
    def upsert_worker(
        self,
        worker_id: str,
        address: str,
        models: Sequence[str],
        capacity: int,
        load: Mapping[str, Any],
        now: float,
    ) -> None:
        """Register a worker or refresh its heartbeat and advertised state."""
        if not worker_id:
            raise ValueError("worker_id must be a non-empty string")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        row = (worker_id, address, json.dumps(list(models)), capacity, json.dumps(dict(load)))
        self._workers[worker_id] = (WorkerRecord.from_row((*row, now), now, 0.0), float(now))

    @op
    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        """Every registered worker, aged as of `now`."""
        return [
            _aged(record, beat_at, now, stale_after_s)
            for _, (record, beat_at) in sorted(self._workers.items())
        ]

    @op
    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker; whether it was registered."""
        return self._workers.pop(worker_id, None) is not None


def _page(
    rows: list[tuple[int, _T]],
    after: str | None,
    limit: int,
    maximum: int,
    *,
    is_ascending: bool = False,
) -> list[_T]:
    """Newest first (oldest first if ascending), after the row whose id is `after`.

    An unknown `after` gives an empty page.
    """
    if not 1 <= limit <= maximum:
        raise ValueError(f"limit must be between 1 and {maximum}, got {limit}")
    rows = sorted(rows, key=lambda row: row[0], reverse=not is_ascending)
    if after is not None:
        ids = [getattr(rec, "id", None) for _, rec in rows]
        if after not in ids:
            return []
        rows = rows[ids.index(after) + 1 :]
    return [rec for _, rec in rows[:limit]]


def _batch_changes(fields: Mapping[str, object]) -> dict[str, Any]:
    """Validate batch fields as the SQL store does; return them as record changes."""
    encode_batch_fields(fields)  # raises ValueError for what a SQL store refuses
    changes = dict(fields)
    if changes.get("expires_at") is not None:
        changes["expires_at"] = int(changes["expires_at"])  # type: ignore[call-overload]
    if changes.get("errors") is not None:
        changes["errors"] = list(changes["errors"])  # type: ignore[call-overload]
    return changes


def _aged(record: WorkerRecord, beat_at: float, now: float, stale_after_s: float) -> WorkerRecord:
    """A worker row aged as of `now`."""
    age_s = float(now) - beat_at
    return dataclasses.replace(
        record, last_heartbeat_at=beat_at, heartbeat_age_s=age_s, is_stale=age_s > stale_after_s
    )
