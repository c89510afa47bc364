"""The job store: durable state of files, batches, shards, the result cache and workers.

`JobStore` is the interface the API, planner and shard runner program against. `SqlJobStore`
implements it once over the named statements in `sql_queries`; the SQLite and PostgreSQL
backends only supply connections, transactions and error translation. The store holds
references (byte ranges, object keys), never prompts or outputs.

All methods are synchronous and thread-safe; async callers run them in a worker thread. Every
time argument is explicit (`now`, unix seconds) so tests and callers control the clock.
"""

from __future__ import annotations

import json
import statistics
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from conveyor.errors import JobStoreUnavailable
from conveyor.stores import sql_queries as q
from conveyor.stores.records import (
    STATUS_TIMESTAMP_FIELD,
    BatchError,
    BatchRecord,
    BatchStatus,
    FileRecord,
    RequestCounts,
    ShardLease,
    ShardRecord,
    ShardSpec,
    ShardStatus,
    WorkerRecord,
    can_transition,
    validate_metadata,
)
from conveyor.stores.sql_queries import Dialect, SqlSession

if TYPE_CHECKING:
    from conveyor.stores.timeouts import PostgresTimeouts

# OpenAI's page-size limits: files list up to 10 000, batches list up to 100.
MAX_FILES_PAGE = 10_000
MAX_BATCHES_PAGE = 100


class StoreError(Exception):
    """A job store operation failed in the database (connection, constraint, closed store)."""


class StoreUnavailableError(StoreError, JobStoreUnavailable):
    """The database cannot serve now (unreachable, timed out, busy, full): the API's 503."""


@dataclass(frozen=True, slots=True)
class SpeculationPolicy:
    """When a running shard is a straggler worth a speculative second run.

    A shard qualifies when it has run longer than `min_running_s` and longer than
    `slow_factor` times the median run time of its batch's committed shards (so a batch
    needs at least one committed shard before anything is speculated).
    """

    slow_factor: float = 3.0
    min_running_s: float = 5.0

    def __post_init__(self) -> None:
        """Reject factors that would speculate on ordinary shards."""
        if self.slow_factor < 1:
            raise ValueError(f"slow_factor must be >= 1, got {self.slow_factor}")
        if self.min_running_s < 0:
            raise ValueError(f"min_running_s must be >= 0, got {self.min_running_s}")

    def is_straggler(self, running_s: float, run_times_s: Sequence[float]) -> bool:
        """Whether a shard running for `running_s` lags its batch's committed `run_times_s`."""
        if not run_times_s or running_s < self.min_running_s:
            return False
        return running_s > self.slow_factor * statistics.median(run_times_s)


class JobStore(Protocol):
    """Durable job state shared by the API, the planner and the shard runners."""

    # -- files -----------------------------------------------------------------------------

    def create_file(self, rec: FileRecord) -> None:
        """Insert a file record (its bytes are already in the object store)."""
        ...

    def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        """Return the tenant's file, or None (also for another tenant's file)."""
        ...

    def list_files(
        self,
        tenant: str,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = MAX_FILES_PAGE,
    ) -> list[FileRecord]:
        """Return the tenant's files newest first, starting after the file id `after`."""
        ...

    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file record; return whether it existed."""
        ...

    # -- batches ---------------------------------------------------------------------------

    def create_batch(self, rec: BatchRecord) -> None:
        """Insert a batch (its `request_counts` are ignored: they derive from shards)."""
        ...

    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """Return the tenant's batch, or None (also for another tenant's batch)."""
        ...

    def get_batch_any(self, batch_id: str) -> BatchRecord | None:
        """Return a batch regardless of tenant (for workers and the planner)."""
        ...

    def list_batches(
        self, tenant: str, after: str | None = None, limit: int = 20
    ) -> list[BatchRecord]:
        """Return the tenant's batches newest first, starting after the batch id `after`."""
        ...

    def transition(
        self,
        batch_id: str,
        from_statuses: Iterable[BatchStatus],
        to_status: BatchStatus,
        now: float,
        **fields: object,
    ) -> bool:
        """Compare-and-set the status, stamp the matching `*_at`, apply `fields` atomically."""
        ...

    def update_batch_fields(self, batch_id: str, **fields: object) -> bool:
        """Update non-status fields of a batch; return whether it exists."""
        ...

    def batches_in_status(self, statuses: Iterable[BatchStatus]) -> list[BatchRecord]:
        """Return every batch (any tenant) in one of `statuses`, oldest first."""
        ...

    # -- shards ----------------------------------------------------------------------------

    def add_shards(self, batch_id: str, shards: Sequence[ShardSpec]) -> None:
        """Insert all shards of a batch in one transaction."""
        ...

    def list_shards(self, batch_id: str) -> list[ShardRecord]:
        """Return the batch's shards ordered by index."""
        ...

    def claim_shard(
        self, worker_id: str, now: float, lease_s: float, batch_ids: Iterable[str] | None = None
    ) -> ShardLease | None:
        """Atomically lease one claimable shard of an in-progress batch, oldest batch first."""
        ...

    def claim_speculative(
        self, worker_id: str, now: float, lease_s: float, policy: SpeculationPolicy
    ) -> ShardLease | None:
        """Lease a second, speculative run of a straggling shard (see `SpeculationPolicy`)."""
        ...

    def renew_lease(self, lease: ShardLease, now: float, lease_s: float) -> bool:
        """Extend the lease to `now + lease_s` if this attempt still holds the shard."""
        ...

    def report_progress(self, lease: ShardLease, num_completed: int, num_failed: int) -> bool:
        """Record this attempt's progress (fenced by attempt)."""
        ...

    def commit_shard(
        self,
        lease: ShardLease,
        now: float,
        output_key: str | None,
        error_key: str | None,
        num_completed: int,
        num_failed: int,
    ) -> bool:
        """Mark the shard done with its outputs, only while this attempt's lease is valid."""
        ...

    def release_shard(self, lease: ShardLease) -> bool:
        """Give a leased shard back (pending) without finishing it, e.g. when draining."""
        ...

    def count_shards(self, batch_id: str) -> dict[ShardStatus, int]:
        """Return the number of the batch's shards in each status (all statuses present)."""
        ...

    # -- result cache ----------------------------------------------------------------------

    def cache_get(self, key: str) -> bytes | None:
        """Return the cached value for a content-addressed key, or None."""
        ...

    def cache_put(self, key: str, value: bytes) -> None:
        """Store a value under its content-addressed key; a second put is a no-op."""
        ...

    # -- worker registry -------------------------------------------------------------------

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
        ...

    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        """Return every registered worker with its heartbeat age and staleness flag."""
        ...

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker; return whether it was registered."""
        ...

    def close(self) -> None:
        """Release connections; later calls raise StoreError."""
        ...


class SqlJobStore(ABC):
    """`JobStore` over SQL; subclasses provide sessions for their dialect.

    A subclass implements `_session`: a context manager yielding a `SqlSession`. With
    `is_write=True` the session is one transaction holding the database's write lock or row
    locks as the dialect needs; driver errors leaving it must be raised as `StoreError`.
    """

    def __init__(self, dialect: Dialect) -> None:
        """Remember the dialect used to pick statement texts."""
        self._dialect = dialect

    @property
    def dialect(self) -> Dialect:
        """The SQL dialect this store speaks."""
        return self._dialect

    @abstractmethod
    def _session(self, *, is_write: bool) -> AbstractContextManager[SqlSession]:
        """Return a context manager yielding a session (a transaction when `is_write`)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; later calls raise StoreError."""

    def _rows(self, query: q.Query, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """Run a read-only query outside a transaction."""
        with self._session(is_write=False) as session:
            return session.query(query.text(self._dialect), params)

    def _change(self, query: q.Query, params: Mapping[str, object]) -> int:
        """Run one write statement in its own transaction; return the rows it changed."""
        with self._session(is_write=True) as session:
            return session.execute(query.text(self._dialect), params)

    # -- files -----------------------------------------------------------------------------

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
        }
        self._change(q.INSERT_FILE, params)

    def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        """Return the tenant's file, or None (also for another tenant's file)."""
        rows = self._rows(q.GET_FILE, {"id": file_id, "tenant": tenant})
        return _decode_file(rows[0]) if rows else None

    def list_files(
        self,
        tenant: str,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = MAX_FILES_PAGE,
    ) -> list[FileRecord]:
        """Return the tenant's files newest first, starting after the file id `after`.

        An unknown `after` id yields an empty page. Ask for `limit + 1` to learn `has_more`.
        """
        _check_limit(limit, MAX_FILES_PAGE)
        params = {"tenant": tenant, "purpose": purpose, "after": after, "limit": limit}
        return [_decode_file(row) for row in self._rows(q.LIST_FILES, params)]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file record; return whether it existed."""
        return self._change(q.DELETE_FILE, {"id": file_id, "tenant": tenant}) > 0

    # -- batches ---------------------------------------------------------------------------

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
        return _decode_batch(rows[0]) if rows else None

    def get_batch_any(self, batch_id: str) -> BatchRecord | None:
        """Return a batch regardless of tenant (for workers and the planner)."""
        rows = self._rows(q.GET_BATCH_ANY, {"id": batch_id})
        return _decode_batch(rows[0]) if rows else None

    def list_batches(
        self, tenant: str, after: str | None = None, limit: int = 20
    ) -> list[BatchRecord]:
        """Return the tenant's batches newest first, starting after the batch id `after`.

        An unknown `after` id yields an empty page. Ask for `limit + 1` to learn `has_more`.
        """
        _check_limit(limit, MAX_BATCHES_PAGE)
        params = {"tenant": tenant, "after": after, "limit": limit}
        return [_decode_batch(row) for row in self._rows(q.LIST_BATCHES, params)]

    def transition(
        self,
        batch_id: str,
        from_statuses: Iterable[BatchStatus],
        to_status: BatchStatus,
        now: float,
        **fields: object,
    ) -> bool:
        """Compare-and-set the status, stamp the matching `*_at`, apply `fields` atomically.

        The `*_at` stamp is `int(now)` (OpenAI reports whole unix seconds). Returns False (and
        changes nothing) when the batch is missing or not in one of `from_statuses`. Raises
        ValueError for an edge the lifecycle forbids, e.g. leaving a terminal status, or for a
        field `update_batch_fields` would reject.
        """
        sources, target = _check_transition(from_statuses, to_status)
        params = _encode_batch_fields(fields)
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
        """Update non-status fields of a batch; return whether it exists.

        Allowed fields: metadata, model, expires_at, output_file_id, error_file_id, errors.
        """
        params = _encode_batch_fields(fields)
        if not params:
            raise ValueError("update_batch_fields needs at least one field")
        sql = q.update_batch_sql(self._dialect, list(params), is_transition=False)
        params["id"] = batch_id
        with self._session(is_write=True) as session:
            return session.execute(sql, params) > 0

    def batches_in_status(self, statuses: Iterable[BatchStatus]) -> list[BatchRecord]:
        """Return every batch (any tenant) in one of `statuses`, oldest first."""
        wanted = q.list_param((BatchStatus(s).value for s in statuses), self._dialect)
        return [_decode_batch(r) for r in self._rows(q.BATCHES_IN_STATUS, {"statuses": wanted})]

    # -- shards ----------------------------------------------------------------------------

    def add_shards(self, batch_id: str, shards: Sequence[ShardSpec]) -> None:
        """Insert all shards of a batch in one transaction.

        Raises ValueError for duplicate indices and StoreError when the batch does not exist
        or already has a shard with one of these indices.
        """
        indices = [s.index for s in shards]
        if len(set(indices)) != len(indices):
            raise ValueError(f"duplicate shard indices for {batch_id}: {sorted(indices)}")
        rows = [
            {
                "batch_id": batch_id,
                "shard_index": s.index,
                "byte_start": s.byte_start,
                "byte_end": s.byte_end,
                "first_line": s.first_line,
                "num_lines": s.num_lines,
            }
            for s in shards
        ]
        with self._session(is_write=True) as session:
            if not session.query(q.BATCH_EXISTS.text(self._dialect), {"id": batch_id}):
                raise StoreError(f"cannot add shards: no batch {batch_id}")
            if rows:
                session.execute_many(q.INSERT_SHARD.text(self._dialect), rows)

    def list_shards(self, batch_id: str) -> list[ShardRecord]:
        """Return the batch's shards ordered by index."""
        return [_decode_shard(r) for r in self._rows(q.LIST_SHARDS, {"batch_id": batch_id})]

    def claim_shard(
        self, worker_id: str, now: float, lease_s: float, batch_ids: Iterable[str] | None = None
    ) -> ShardLease | None:
        """Atomically lease one claimable shard of an in-progress batch, oldest batch first.

        Claimable: pending, or leased with `lease_expires_at <= now`. The claim increments
        `attempt` and resets the shard's progress, so the previous holder is fenced out and its
        counts stop contributing to the batch. `batch_ids` restricts the claim to those
        batches. Returns None when nothing is claimable (or, on PostgreSQL, when every
        candidate is being claimed by someone else at this instant).
        """
        _require_worker(worker_id)
        _check_lease_s(lease_s)
        params = {
            "worker_id": worker_id,
            "now": float(now),
            "lease_expires_at": float(now) + float(lease_s),
            "all_batches": batch_ids is None,
            "batch_ids": q.list_param(batch_ids or (), self._dialect),
        }
        with self._session(is_write=True) as session:
            rows = session.query(q.CLAIM_SHARD.text(self._dialect), params)
        return _decode_lease(rows[0]) if rows else None

    def claim_speculative(
        self, worker_id: str, now: float, lease_s: float, policy: SpeculationPolicy
    ) -> ShardLease | None:
        """Lease a speculative run of the oldest straggler on another worker, or None.

        The original attempt keeps its lease; both may commit and the first one wins. At most
        one speculative run per shard; a reclaim or release of the original ends it.
        """
        _require_worker(worker_id)
        _check_lease_s(lease_s)
        probe = {"worker_id": worker_id, "now": float(now)}
        probe["started_before"] = float(now) - policy.min_running_s
        with self._session(is_write=True) as session:
            candidates = session.query(q.SPECULATION_CANDIDATES.text(self._dialect), probe)
            run_times: dict[str, list[float]] = {}
            for batch_id, index, attempt, started_at in candidates:
                if batch_id not in run_times:
                    rows = session.query(
                        q.SHARD_RUN_TIMES.text(self._dialect), {"batch_id": batch_id}
                    )
                    run_times[batch_id] = [float(row[0]) for row in rows]
                if not policy.is_straggler(float(now) - float(started_at), run_times[batch_id]):
                    continue
                claim = {"batch_id": batch_id, "shard_index": index, "attempt": attempt}
                claim |= {"worker_id": worker_id, "lease_expires_at": float(now) + lease_s}
                rows = session.query(q.CLAIM_SPECULATIVE.text(self._dialect), claim)
                if rows:
                    return _decode_lease(rows[0], is_speculative=True)
        return None

    def renew_lease(self, lease: ShardLease, now: float, lease_s: float) -> bool:
        """Extend the lease to `now + lease_s` if this attempt still holds the shard.

        False once another attempt took the shard over or it was committed or released. An
        expired lease nobody took over yet can still be renewed: the attempt is still the
        newest, so no other worker can hold the shard.
        """
        _check_lease_s(lease_s)
        params = _fence(lease) | {"lease_expires_at": float(now) + float(lease_s)}
        query = q.RENEW_SPECULATIVE if lease.is_speculative else q.RENEW_LEASE
        return self._change(query, params) > 0

    def report_progress(self, lease: ShardLease, num_completed: int, num_failed: int) -> bool:
        """Record this attempt's progress (fenced by attempt); False for a stale attempt."""
        _check_counts(lease, num_completed, num_failed)
        if lease.is_speculative:
            # The batch's counts follow the original; a speculative run only proves it holds.
            return bool(self._rows(q.SPECULATIVE_HELD, _fence(lease)))
        params = _fence(lease) | {"num_completed": num_completed, "num_failed": num_failed}
        return self._change(q.REPORT_PROGRESS, params) > 0

    def commit_shard(
        self,
        lease: ShardLease,
        now: float,
        output_key: str | None,
        error_key: str | None,
        num_completed: int,
        num_failed: int,
    ) -> bool:
        """Mark the shard done with its outputs, only while this attempt's lease is valid.

        Returns False and changes nothing when the attempt is stale, the lease expired
        (`lease_expires_at <= now`), or the shard was already committed or released.
        """
        _check_counts(lease, num_completed, num_failed)
        params = _fence(lease) | {
            "now": float(now),
            "output_key": output_key,
            "error_key": error_key,
            "num_completed": num_completed,
            "num_failed": num_failed,
        }
        query = q.COMMIT_SPECULATIVE if lease.is_speculative else q.COMMIT_SHARD
        return self._change(query, params) > 0

    def release_shard(self, lease: ShardLease) -> bool:
        """Give a leased shard back (pending) without finishing it, e.g. when draining.

        The attempt counter is kept, so the released attempt stays fenced out. Releasing a
        speculative lease only frees its slot; the original keeps running.
        """
        query = q.RELEASE_SPECULATIVE if lease.is_speculative else q.RELEASE_SHARD
        return self._change(query, _fence(lease)) > 0

    def count_shards(self, batch_id: str) -> dict[ShardStatus, int]:
        """Return the number of the batch's shards in each status (all statuses present)."""
        counts = dict.fromkeys(ShardStatus, 0)
        for status, num in self._rows(q.COUNT_SHARDS, {"batch_id": batch_id}):
            counts[ShardStatus(status)] = int(num)
        return counts

    # -- result cache ----------------------------------------------------------------------

    def cache_get(self, key: str) -> bytes | None:
        """Return the cached value for a content-addressed key, or None."""
        rows = self._rows(q.CACHE_GET, {"key": key})
        return bytes(rows[0][0]) if rows else None

    def cache_put(self, key: str, value: bytes) -> None:
        """Store a value under its content-addressed key; a second put is a no-op.

        The key is a content hash, so an existing entry already holds the same value.
        """
        if not key:
            raise ValueError("cache key must be a non-empty string")
        self._change(q.CACHE_PUT, {"key": key, "value": bytes(value)})

    # -- worker registry -------------------------------------------------------------------

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
        _require_worker(worker_id)
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        params = {
            "worker_id": worker_id,
            "address": address,
            "models": json.dumps(list(models)),
            "capacity": capacity,
            "load": json.dumps(dict(load)),
            "now": float(now),
        }
        self._change(q.UPSERT_WORKER, params)

    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        """Return every registered worker with its heartbeat age and staleness flag.

        A worker is stale when its last heartbeat is more than `stale_after_s` old. Stale
        workers are listed too so a reaper can find and remove them; routers filter them out.
        """
        workers = []
        for worker_id, address, models, capacity, load, heartbeat_at in self._rows(
            q.LIST_WORKERS, {}
        ):
            age_s = float(now) - float(heartbeat_at)
            workers.append(
                WorkerRecord(
                    worker_id=worker_id,
                    address=address,
                    models=tuple(json.loads(models)),
                    capacity=int(capacity),
                    load=json.loads(load),
                    last_heartbeat_at=float(heartbeat_at),
                    heartbeat_age_s=age_s,
                    is_stale=age_s > stale_after_s,
                )
            )
        return workers

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker; return whether it was registered."""
        return self._change(q.REMOVE_WORKER, {"worker_id": worker_id}) > 0


def open_job_store(url: str, *, postgres_timeouts: PostgresTimeouts | None = None) -> JobStore:
    """Open (and migrate) the job store at `url`.

    `sqlite:///abs/path.db` or `sqlite://relative/path.db` (parent directories are created),
    or `postgresql://user@host:port/dbname` (libpq URL; `postgres_timeouts` bound its waits).
    """
    if url.startswith("sqlite:"):
        # Imported here so each backend's driver loads only when used.
        from conveyor.stores.sqlite_store import SqliteJobStore

        return SqliteJobStore.from_url(url)
    if url.startswith(("postgresql://", "postgres://")):
        from conveyor.stores.postgres_store import PostgresJobStore

        return PostgresJobStore(url, timeouts=postgres_timeouts)
    raise ValueError(f"unsupported job store URL (want sqlite:// or postgresql://): {url!r}")


# -- encoding and decoding (private) -----------------------------------------------------------


def _check_limit(limit: int, maximum: int) -> None:
    """Reject page sizes outside 1..maximum."""
    if not 1 <= limit <= maximum:
        raise ValueError(f"limit must be between 1 and {maximum}, got {limit}")


def _check_lease_s(lease_s: float) -> None:
    """Reject non-positive lease durations."""
    if lease_s <= 0:
        raise ValueError(f"lease_s must be > 0, got {lease_s}")


def _require_worker(worker_id: str) -> None:
    """Reject an empty worker id (it would make every lease look unowned)."""
    if not worker_id:
        raise ValueError("worker_id must be a non-empty string")


def _check_counts(lease: ShardLease, num_completed: int, num_failed: int) -> None:
    """Reject negative counts and counts exceeding the shard's lines."""
    if num_completed < 0 or num_failed < 0:
        raise ValueError(f"counts must be >= 0, got {num_completed}, {num_failed}")
    if num_completed + num_failed > lease.num_lines:
        raise ValueError(
            f"{num_completed} completed + {num_failed} failed exceeds the shard's "
            f"{lease.num_lines} lines"
        )


def _check_transition(
    from_statuses: Iterable[BatchStatus], to_status: BatchStatus
) -> tuple[list[BatchStatus], BatchStatus]:
    """Validate a CAS transition against the lifecycle; return the sources and target."""
    target = BatchStatus(to_status)
    sources = [BatchStatus(s) for s in from_statuses]
    if not sources:
        raise ValueError("transition needs at least one from-status")
    for source in sources:
        if not can_transition(source, target):
            raise ValueError(f"batch cannot move from {source} to {target}")
    return sources, target


def _fence(lease: ShardLease) -> dict[str, object]:
    """Parameters identifying the exact shard attempt a lease operation applies to."""
    return {
        "batch_id": lease.batch_id,
        "shard_index": lease.index,
        "attempt": lease.attempt,
        "worker_id": lease.worker_id,
    }


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


def _encode_batch_fields(fields: Mapping[str, object]) -> dict[str, object]:
    """Validate caller-supplied batch fields and encode them as column parameters."""
    unknown = set(fields) - q.BATCH_UPDATABLE_COLUMNS
    if unknown:
        allowed = sorted(q.BATCH_UPDATABLE_COLUMNS)
        raise ValueError(f"cannot update batch fields {sorted(unknown)}; allowed: {allowed}")
    params: dict[str, object] = {}
    for name, value in fields.items():
        if name == "metadata":
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"metadata must be a dict or None, got {value!r}")
            validate_metadata(value)
            params[name] = _dump_json(value)
        elif name == "errors":
            params[name] = _encode_errors(value)
        elif name == "expires_at":
            if value is not None and not isinstance(value, int | float):
                raise ValueError(f"expires_at must be unix seconds or None, got {value!r}")
            params[name] = None if value is None else int(value)
        else:
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string or None, got {value!r}")
            params[name] = value
    return params


def _decode_file(row: tuple[Any, ...]) -> FileRecord:
    """Build a FileRecord from a row in `FILE_COLUMNS` order."""
    file_id, tenant, filename, purpose, num_bytes, created_at, object_key, status = row
    return FileRecord(
        id=file_id,
        tenant=tenant,
        filename=filename,
        purpose=purpose,
        bytes=int(num_bytes),
        created_at=int(created_at),
        object_key=object_key,
        status=status,
    )


def _decode_batch(row: tuple[Any, ...]) -> BatchRecord:
    """Build a BatchRecord from a row of `BATCH_SELECT` (stored columns + shard sums)."""
    num_stored = len(q.BATCH_STORED_COLUMNS)
    values: dict[str, Any] = dict(zip(q.BATCH_STORED_COLUMNS, row[:num_stored], strict=True))
    total, completed, failed = row[num_stored:]
    values["status"] = BatchStatus(values["status"])
    values["metadata"] = None if values["metadata"] is None else json.loads(values["metadata"])
    raw_errors = values["errors"]
    values["errors"] = (
        None if raw_errors is None else [BatchError.from_dict(e) for e in json.loads(raw_errors)]
    )
    counts = RequestCounts(total=int(total), completed=int(completed), failed=int(failed))
    return BatchRecord(**values, request_counts=counts)


def _decode_shard(row: tuple[Any, ...]) -> ShardRecord:
    """Build a ShardRecord from a row in `SHARD_COLUMNS` order."""
    (batch_id, index, byte_start, byte_end, first_line, num_lines, status, attempt) = row[:8]
    (owner, expires_at, output_key, error_key, completed, failed, started, committed) = row[8:]
    return ShardRecord(
        batch_id=batch_id,
        index=int(index),
        byte_start=int(byte_start),
        byte_end=int(byte_end),
        first_line=int(first_line),
        num_lines=int(num_lines),
        status=ShardStatus(status),
        attempt=int(attempt),
        lease_owner=owner,
        lease_expires_at=None if expires_at is None else float(expires_at),
        output_key=output_key,
        error_key=error_key,
        num_completed=int(completed),
        num_failed=int(failed),
        started_at=None if started is None else float(started),
        committed_at=None if committed is None else float(committed),
    )


def _decode_lease(row: tuple[Any, ...], *, is_speculative: bool = False) -> ShardLease:
    """Build a ShardLease from the RETURNING row of `CLAIM_SHARD` or `CLAIM_SPECULATIVE`."""
    batch_id, index, attempt, owner, expires_at, byte_start, byte_end, first_line, lines = row
    return ShardLease(
        batch_id=batch_id,
        index=int(index),
        attempt=int(attempt),
        worker_id=owner,
        lease_expires_at=float(expires_at),
        byte_start=int(byte_start),
        byte_end=int(byte_end),
        first_line=int(first_line),
        num_lines=int(lines),
        is_speculative=is_speculative,
    )
