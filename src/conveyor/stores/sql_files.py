"""Files and batches over SQL: records in, records out (`from_row`), nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from conveyor.stores import sql_queries as q
from conveyor.stores.protocols import MAX_BATCHES_PAGE, MAX_FILES_PAGE, ListOrder
from conveyor.stores.records import (
    STATUS_TIMESTAMP_FIELD,
    BatchError,
    BatchRecord,
    BatchStatus,
    FileRecord,
    validate_metadata,
)
from conveyor.stores.sql_base import SqlStore, check_limit
from conveyor.stores.sql_deletes import DELETE_BATCH, DELETE_BATCH_SHARDS


class SqlFileStore(SqlStore):
    """`FileStore` over SQL."""

    def create_file(self, rec: FileRecord) -> None:
        """Insert a file record (its bytes are already in the object store)."""
        params = {
            "id": rec.id,
            "tenant": rec.tenant,
            "filename": rec.filename,
            "purpose": rec.purpose,
            "bytes": rec.bytes,
            "created_at": rec.created_at,
            "object_key": rec.object_key,
            "status": rec.status,
            "expires_at": rec.expires_at,
        }
        self._change(q.INSERT_FILE, params)

    def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        """Return the tenant's file, or None (also for another tenant's file)."""
        rows = self._rows(q.GET_FILE, {"id": file_id, "tenant": tenant})
        return FileRecord.from_row(rows[0]) if rows else None

    def list_files(
        self,
        tenant: str,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = MAX_FILES_PAGE,
        *,
        order: ListOrder = "desc",
    ) -> list[FileRecord]:
        """Return the tenant's files newest first (oldest first for `asc`), after the id `after`."""
        check_limit(limit, MAX_FILES_PAGE)
        query = q.LIST_FILES_ASC if order == "asc" else q.LIST_FILES
        params = {"tenant": tenant, "purpose": purpose, "after": after, "limit": limit}
        return [FileRecord.from_row(row) for row in self._rows(query, params)]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file record; return whether it existed."""
        return self._change(q.DELETE_FILE, {"id": file_id, "tenant": tenant}) > 0

    def expired_files(self, now: float, limit: int) -> list[FileRecord]:
        """Return up to `limit` files of any tenant whose `expires_at` is at or before `now`."""
        check_limit(limit, MAX_FILES_PAGE)
        rows = self._rows(q.EXPIRED_FILES, {"now": int(now), "limit": limit})
        return [FileRecord.from_row(row) for row in rows]


class SqlBatchStore(SqlStore):
    """`BatchStore` over SQL."""

    def create_batch(self, rec: BatchRecord) -> None:
        """Insert a batch (its `request_counts` are ignored: they derive from shards)."""
        params: dict[str, object] = {c: getattr(rec, c) for c in q.BATCH_STORED_COLUMNS}
        params["status"] = rec.status.value
        params["metadata"] = _dump_json(rec.metadata)
        params["errors"] = _encode_errors(rec.errors)
        self._change(q.INSERT_BATCH, params)

    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """Return the tenant's batch, or None (also for another tenant's batch)."""
        rows = self._rows(q.GET_BATCH, {"id": batch_id, "tenant": tenant})
        return BatchRecord.from_row(rows[0]) if rows else None

    def get_batch_any(self, batch_id: str) -> BatchRecord | None:
        """Return a batch regardless of tenant (for workers and the planner)."""
        rows = self._rows(q.GET_BATCH_ANY, {"id": batch_id})
        return BatchRecord.from_row(rows[0]) if rows else None

    def list_batches(
        self,
        tenant: str,
        after: str | None = None,
        limit: int = 20,
        *,
        order: ListOrder = "desc",
        endpoint: str | None = None,
    ) -> list[BatchRecord]:
        """Return the tenant's batches newest first (oldest first for `asc`), after `after`;
        with `endpoint`, only that endpoint's."""
        check_limit(limit, MAX_BATCHES_PAGE)
        params = {"tenant": tenant, "after": after, "limit": limit, "endpoint": endpoint}
        query = q.LIST_BATCHES_ASC if order == "asc" else q.LIST_BATCHES
        return [BatchRecord.from_row(row) for row in self._rows(query, params)]

    def delete_batch(self, tenant: str, batch_id: str) -> bool:
        """Delete the tenant's batch and its shards (one transaction); whether it existed."""
        params = {"id": batch_id, "tenant": tenant}
        with self._session(is_write=True) as session:
            if session.execute(DELETE_BATCH.text(self._dialect), params) == 0:
                return False
            session.execute(DELETE_BATCH_SHARDS.text(self._dialect), {"id": batch_id})
            return True

    def transition(
        self,
        batch_id: str,
        from_statuses: Iterable[BatchStatus],
        to_status: BatchStatus,
        now: float,
        **fields: object,
    ) -> bool:
        """Compare-and-set the status, stamp the matching `*_at` (`int(now)`), apply `fields`.

        Raises ValueError without from-statuses or for a field `update_batch_fields` rejects.
        """
        target = BatchStatus(to_status)
        sources = [BatchStatus(s) for s in from_statuses]
        if not sources:
            raise ValueError("transition needs at least one from-status")
        params = encode_batch_fields(fields)
        params[STATUS_TIMESTAMP_FIELD[target]] = int(now)
        sql = q.update_batch_sql(self._dialect, list(params), is_transition=True)
        params.update(
            id=batch_id,
            to_status=target.value,
            from_statuses=q.list_param(sources, self._dialect),
        )
        with self._session(is_write=True) as session:
            return session.execute(sql, params) > 0

    def update_batch_fields(self, batch_id: str, **fields: object) -> bool:
        """Update non-status fields of a batch; return whether it exists."""
        params = encode_batch_fields(fields)
        if not params:
            raise ValueError("update_batch_fields needs at least one field")
        sql = q.update_batch_sql(self._dialect, list(params), is_transition=False)
        params["id"] = batch_id
        with self._session(is_write=True) as session:
            return session.execute(sql, params) > 0

    def batches_in_status(self, statuses: Iterable[BatchStatus]) -> list[BatchRecord]:
        """Return every batch (any tenant) in one of `statuses`, oldest first."""
        wanted = q.list_param((BatchStatus(s).value for s in statuses), self._dialect)
        rows = self._rows(q.BATCHES_IN_STATUS, {"statuses": wanted})
        return [BatchRecord.from_row(row) for row in rows]


def encode_batch_fields(fields: Mapping[str, object]) -> dict[str, object]:
    """Validate caller-supplied batch fields and encode them as column parameters."""
    unknown = set(fields) - q.BATCH_UPDATABLE_COLUMNS
    if unknown:
        allowed = sorted(q.BATCH_UPDATABLE_COLUMNS)
        raise ValueError(f"cannot update batch fields {sorted(unknown)}; allowed: {allowed}")
    return {name: _encode_field(name, value) for name, value in fields.items()}


def _encode_field(name: str, value: object) -> object:
    """One batch field as its column parameter (ValueError for a wrong type)."""
    if name == "metadata":
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"metadata must be a dict or None, got {value!r}")
        validate_metadata(value)
        return _dump_json(value)
    if name == "errors":
        return _encode_errors(value)
    if name == "expires_at":
        if value is not None and not isinstance(value, int | float):
            raise ValueError(f"expires_at must be unix seconds or None, got {value!r}")
        return None if value is None else int(value)
    if name == "queued_input_tokens":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"queued_input_tokens must be an int >= 0, got {value!r}")
        return value
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{name} must be a string or None, got {value!r}")
    return value


def _dump_json(value: object) -> str | None:
    """JSON text for a nullable column."""
    return None if value is None else json.dumps(value)


def _encode_errors(errors: object) -> str | None:
    """JSON text for the `errors` column from a list of BatchError (or None)."""
    if errors is None:
        return None
    if not isinstance(errors, list | tuple) or not all(isinstance(e, BatchError) for e in errors):
        raise ValueError(f"errors must be a list of BatchError, got {errors!r}")
    return json.dumps([e.to_dict() for e in errors])
