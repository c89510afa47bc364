"""Every SQL statement the job stores run, in one place.

Statements are written once with `:name` placeholders and rendered per dialect: SQLite takes
them as they are, psycopg gets `%(name)s`. Where the dialects really differ the statement is
spelled out twice, side by side, so the difference is visible:

- list membership: SQLite reads a JSON array with `json_each`, PostgreSQL takes an array with
  `= ANY(...)` (see `list_param`);
- claiming a shard: PostgreSQL locks the candidate row with `FOR UPDATE SKIP LOCKED`; SQLite
  has no row locks and relies on the caller's `BEGIN IMMEDIATE`, which serialises writers.

Shared statements avoid `::` casts (which would read as placeholders) and use `CAST(...)`.
A NULL parameter is wrapped in `CAST(:p AS TEXT)` because PostgreSQL cannot infer the type of
a bare untyped NULL in `:p IS NULL`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from conveyor.stores.records import BATCH_COLUMNS, STATUS_TIMESTAMP_FIELD, BatchStatus, ShardStatus


class Dialect(StrEnum):
    """The SQL dialects the job store speaks."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


class SqlSession(Protocol):
    """One connection (inside or outside a transaction) that runs rendered SQL."""

    def query(self, sql: str, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """Run a statement that returns rows and return all of them."""
        ...

    def execute(self, sql: str, params: Mapping[str, object]) -> int:
        """Run a statement and return the number of rows it changed."""
        ...

    def execute_many(self, sql: str, rows: Sequence[Mapping[str, object]]) -> None:
        """Run one statement once per parameter set."""
        ...


# `:name` but not the second colon of a `::` cast.
_PLACEHOLDER = re.compile(r"(?<!:):([A-Za-z_][A-Za-z0-9_]*)")


def render(sql: str, dialect: Dialect) -> str:
    """Turn `:name` placeholders into the dialect's parameter style."""
    if dialect is Dialect.SQLITE:
        return sql
    # psycopg treats a bare % as a placeholder start, so literal ones must be doubled first.
    return _PLACEHOLDER.sub(r"%(\1)s", sql.replace("%", "%%"))


@dataclass(frozen=True, slots=True)
class Query:
    """A named statement, rendered for both dialects at import time."""

    name: str
    sqlite: str
    postgres: str

    def text(self, dialect: Dialect) -> str:
        """Return the statement for `dialect`."""
        return self.sqlite if dialect is Dialect.SQLITE else self.postgres


def shared(name: str, sql: str) -> Query:
    """Build a query whose text is the same in both dialects."""
    return Query(name, render(sql, Dialect.SQLITE), render(sql, Dialect.POSTGRES))


def per_dialect(name: str, *, sqlite: str, postgres: str) -> Query:
    """Build a query spelled differently per dialect."""
    return Query(name, render(sqlite, Dialect.SQLITE), render(postgres, Dialect.POSTGRES))


def in_list(column: str, param: str, dialect: Dialect) -> str:
    """Return a `column IN <list parameter>` predicate for `dialect` (`:param` placeholder)."""
    if dialect is Dialect.SQLITE:
        return f"{column} IN (SELECT value FROM json_each(:{param}))"
    return f"{column} = ANY(:{param})"


def list_param(values: Iterable[str], dialect: Dialect) -> object:
    """Encode a list parameter for the predicate built by `in_list`."""
    items = [str(v) for v in values]
    return json.dumps(items) if dialect is Dialect.SQLITE else items


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

FILE_COLUMNS = "id, tenant, filename, purpose, bytes, created_at, object_key, status, expires_at"

INSERT_FILE = shared(
    "insert_file",
    f"INSERT INTO files ({FILE_COLUMNS}) "
    "VALUES (:id, :tenant, :filename, :purpose, :bytes, :created_at, :object_key, :status, "
    ":expires_at)",
)

GET_FILE = shared(
    "get_file",
    f"SELECT {FILE_COLUMNS} FROM files WHERE id = :id AND tenant = :tenant",
)


def _list_files_sql(is_ascending: bool) -> str:
    """List a tenant's files in one direction; `after` is the last id of the previous page."""
    beyond, direction = (">", "ASC") if is_ascending else ("<", "DESC")
    return (
        f"SELECT {FILE_COLUMNS} FROM files WHERE tenant = :tenant "
        "AND (CAST(:purpose AS TEXT) IS NULL OR purpose = :purpose) "
        "AND (CAST(:after AS TEXT) IS NULL "
        f"     OR seq {beyond} "
        "(SELECT a.seq FROM files a WHERE a.id = :after AND a.tenant = :tenant)) "
        f"ORDER BY seq {direction} LIMIT :limit"
    )


# Newest first (OpenAI's default `order=desc`) and oldest first (`order=asc`).
LIST_FILES = shared("list_files", _list_files_sql(is_ascending=False))
LIST_FILES_ASC = shared("list_files_asc", _list_files_sql(is_ascending=True))

DELETE_FILE = shared("delete_file", "DELETE FROM files WHERE id = :id AND tenant = :tenant")

# Every tenant's files whose `expires_at` has passed, soonest expired first.
EXPIRED_FILES = shared(
    "expired_files",
    f"SELECT {FILE_COLUMNS} FROM files WHERE expires_at IS NOT NULL AND expires_at <= :now "
    "ORDER BY expires_at, seq LIMIT :limit",
)

# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------

BATCH_STORED_COLUMNS = BATCH_COLUMNS

# Columns a caller may change with `update_batch_fields` or alongside a transition. Status and
# the `*_at` stamps are owned by `transition`; ids and tenant never change.
BATCH_UPDATABLE_COLUMNS: frozenset[str] = frozenset(
    {
        "metadata",
        "model",
        "expires_at",
        "output_file_id",
        "error_file_id",
        "errors",
        "queued_input_tokens",
    }
)


def _shard_sum(column: str) -> str:
    """Correlated sum of a shard column for the batch row `b` (BIGINT in both dialects)."""
    return (
        f"(SELECT CAST(COALESCE(SUM(s.{column}), 0) AS BIGINT) "
        "FROM shards s WHERE s.batch_id = b.id)"
    )


# Request counts are derived from the shards on every read, never stored on the batch, so
# they move while shards report progress and a reclaimed shard replaces (not adds to) its count.
# The peaks are each shard's highest reported counts, which a reclaim does not reset.
BATCH_SELECT = (
    "SELECT "
    + ", ".join(f"b.{c}" for c in BATCH_STORED_COLUMNS)
    + f", {_shard_sum('num_lines')}, {_shard_sum('num_completed')}, {_shard_sum('num_failed')}"
    + f", {_shard_sum('input_tokens')}, {_shard_sum('output_tokens')}"
    + f", {_shard_sum('peak_completed')}, {_shard_sum('peak_failed')} "
    + "FROM batches b"
)

INSERT_BATCH = shared(
    "insert_batch",
    f"INSERT INTO batches ({', '.join(BATCH_STORED_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in BATCH_STORED_COLUMNS)})",
)

GET_BATCH = shared("get_batch", f"{BATCH_SELECT} WHERE b.id = :id AND b.tenant = :tenant")

GET_BATCH_ANY = shared("get_batch_any", f"{BATCH_SELECT} WHERE b.id = :id")


def _list_batches_sql(is_ascending: bool) -> str:
    """A tenant's batches (one `endpoint`'s, unless null) one way; `after`: last id seen."""
    beyond, direction = (">", "ASC") if is_ascending else ("<", "DESC")
    return (
        f"{BATCH_SELECT} WHERE b.tenant = :tenant "
        "AND (CAST(:endpoint AS TEXT) IS NULL OR b.endpoint = :endpoint) "
        f"AND (CAST(:after AS TEXT) IS NULL OR b.seq {beyond} "
        "(SELECT a.seq FROM batches a WHERE a.id = :after AND a.tenant = :tenant)) "
        f"ORDER BY b.seq {direction} LIMIT :limit"
    )


LIST_BATCHES = shared("list_batches", _list_batches_sql(is_ascending=False))
LIST_BATCHES_ASC = shared("list_batches_asc", _list_batches_sql(is_ascending=True))

BATCHES_IN_STATUS = per_dialect(
    "batches_in_status",
    sqlite=f"{BATCH_SELECT} WHERE {in_list('b.status', 'statuses', Dialect.SQLITE)} ORDER BY b.seq",
    postgres=f"{BATCH_SELECT} WHERE {in_list('b.status', 'statuses', Dialect.POSTGRES)} "
    "ORDER BY b.seq",
)


def update_batch_sql(dialect: Dialect, columns: Sequence[str], *, is_transition: bool) -> str:
    """Build the UPDATE for `update_batch_fields` or `transition`.

    `columns` are bound as `:<column>`. They are formatted into the statement as identifiers,
    so anything outside the known batch columns is refused here. A transition also sets
    `status` and is guarded by `:from_statuses` (the compare-and-set).
    """
    unknown = set(columns) - BATCH_UPDATABLE_COLUMNS - set(STATUS_TIMESTAMP_FIELD.values())
    if unknown:
        raise ValueError(f"not updatable batch columns: {sorted(unknown)}")
    assignments = [f"{c} = :{c}" for c in columns]
    where = "id = :id"
    if is_transition:
        assignments.insert(0, "status = :to_status")
        where += " AND " + in_list("status", "from_statuses", dialect)
    if not assignments:
        raise ValueError("an UPDATE needs at least one column")
    return render(f"UPDATE batches SET {', '.join(assignments)} WHERE {where}", dialect)


# ---------------------------------------------------------------------------------------------
# Shards
# ---------------------------------------------------------------------------------------------

SHARD_COLUMNS = (
    "batch_id, shard_index, byte_start, byte_end, first_line, num_lines, status, attempt, "
    "lease_owner, lease_expires_at, output_key, error_key, num_completed, num_failed, "
    "started_at, committed_at"
)

INSERT_SHARD = shared(
    "insert_shard",
    "INSERT INTO shards (batch_id, shard_index, byte_start, byte_end, first_line, num_lines, "
    "status, attempt, num_completed, num_failed) "
    "VALUES (:batch_id, :shard_index, :byte_start, :byte_end, :first_line, :num_lines, "
    f"'{ShardStatus.PENDING}', 0, 0, 0)",
)

BATCH_EXISTS = shared("batch_exists", "SELECT 1 FROM batches WHERE id = :id")

LIST_SHARDS = shared(
    "list_shards",
    f"SELECT {SHARD_COLUMNS} FROM shards WHERE batch_id = :batch_id ORDER BY shard_index",
)

COUNT_SHARDS = shared(
    "count_shards",
    "SELECT status, COUNT(*) FROM shards WHERE batch_id = :batch_id GROUP BY status",
)


# The lease rule, in SQL (`conveyor.jobs.leases.is_live` states it for Python): a lease is
# live while `lease_expires_at > now`; at `now` itself it has expired and may be taken over.
def live_lease(column: str = "lease_expires_at") -> str:
    """The predicate "the lease whose expiry is `column` is still live at `:now`"."""
    return f"{column} > :now"


LIVE_LEASE = live_lease()

# A shard is claimable when pending, or leased with an expired lease, and its batch is running.
_CLAIM_CANDIDATE = (
    "SELECT s.batch_id, s.shard_index FROM shards s JOIN batches b ON b.id = s.batch_id "
    f"WHERE b.status = '{BatchStatus.IN_PROGRESS}' "
    f"AND (s.status = '{ShardStatus.PENDING}' "
    f"     OR (s.status = '{ShardStatus.LEASED}' AND NOT {live_lease('s.lease_expires_at')})) "
    "AND (:all_batches OR {batch_filter}) "
    "ORDER BY b.seq, s.shard_index LIMIT 1"
)

# Taking a lease bumps `attempt` (the fencing token) and resets the previous attempt's progress
# and outputs so a reclaimed shard never counts twice.
_CLAIM_UPDATE = (
    f"UPDATE shards SET status = '{ShardStatus.LEASED}', attempt = attempt + 1, "
    "lease_owner = :worker_id, lease_expires_at = :lease_expires_at, "
    "num_completed = 0, num_failed = 0, output_key = NULL, error_key = NULL, "
    "started_at = :now, committed_at = NULL, spec_owner = NULL, spec_expires_at = NULL "
    "WHERE (batch_id, shard_index) = ({candidate}) "
    "RETURNING batch_id, shard_index, attempt, lease_owner, lease_expires_at, "
    "byte_start, byte_end, first_line, num_lines"
)

CLAIM_SHARD = per_dialect(
    "claim_shard",
    # Runs inside BEGIN IMMEDIATE: the write lock is held from the SELECT to the UPDATE.
    sqlite=_CLAIM_UPDATE.format(
        candidate=_CLAIM_CANDIDATE.format(
            batch_filter=in_list("s.batch_id", "batch_ids", Dialect.SQLITE)
        )
    ),
    # SKIP LOCKED lets concurrent claimers pass over each other's candidate instead of
    # blocking on it and then re-checking a row that is no longer claimable.
    postgres=_CLAIM_UPDATE.format(
        candidate=_CLAIM_CANDIDATE.format(
            batch_filter=in_list("s.batch_id", "batch_ids", Dialect.POSTGRES)
        )
        + " FOR UPDATE OF s SKIP LOCKED"
    ),
)

# Fencing: every lease operation names the attempt it believes it holds.
_FENCE = (
    "WHERE batch_id = :batch_id AND shard_index = :shard_index AND attempt = :attempt "
    f"AND lease_owner = :worker_id AND status = '{ShardStatus.LEASED}'"
)

RENEW_LEASE = shared(
    "renew_lease",
    f"UPDATE shards SET lease_expires_at = :lease_expires_at {_FENCE}",
)

# Raising the peaks in the statement that writes the counts keeps them exact under
# concurrent writers (the row is the unit; no read-modify-write across statements).
_RAISE_PEAKS = (
    "peak_completed = CASE WHEN :num_completed > peak_completed THEN :num_completed "
    "ELSE peak_completed END, "
    "peak_failed = CASE WHEN :num_failed > peak_failed THEN :num_failed ELSE peak_failed END"
)

REPORT_PROGRESS = shared(
    "report_progress",
    "UPDATE shards SET num_completed = :num_completed, num_failed = :num_failed, "
    f"{_RAISE_PEAKS} {_FENCE}",
)

COMMIT_SHARD = shared(
    "commit_shard",
    f"UPDATE shards SET status = '{ShardStatus.DONE}', output_key = :output_key, "
    "error_key = :error_key, num_completed = :num_completed, num_failed = :num_failed, "
    f"{_RAISE_PEAKS}, committed_at = :now, lease_expires_at = NULL {_FENCE} AND {LIVE_LEASE}",
)

RELEASE_SHARD = shared(
    "release_shard",
    f"UPDATE shards SET status = '{ShardStatus.PENDING}', lease_owner = NULL, "
    "lease_expires_at = NULL, num_completed = 0, num_failed = 0, started_at = NULL, "
    f"spec_owner = NULL, spec_expires_at = NULL {_FENCE}",
)

# -- straggler speculation: a second holder of a leased shard, fenced by its own owner slot --

# Shards running on someone else's live lease with no speculative copy yet, and since when.
SPECULATION_CANDIDATES = shared(
    "speculation_candidates",
    "SELECT s.batch_id, s.shard_index, s.attempt, s.started_at FROM shards s "
    "JOIN batches b ON b.id = s.batch_id "
    f"WHERE b.status = '{BatchStatus.IN_PROGRESS}' AND s.status = '{ShardStatus.LEASED}' "
    f"AND {live_lease('s.lease_expires_at')} AND s.spec_owner IS NULL "
    "AND s.lease_owner <> :worker_id "
    "AND s.started_at <= :started_before "
    "ORDER BY b.seq, s.started_at",
)

# How long each committed shard of a batch ran (for the batch's median).
SHARD_RUN_TIMES = shared(
    "shard_run_times",
    "SELECT committed_at - started_at FROM shards "
    f"WHERE batch_id = :batch_id AND status = '{ShardStatus.DONE}' "
    "AND started_at IS NOT NULL AND committed_at IS NOT NULL",
)

CLAIM_SPECULATIVE = shared(
    "claim_speculative",
    "UPDATE shards SET spec_owner = :worker_id, spec_expires_at = :lease_expires_at "
    "WHERE batch_id = :batch_id AND shard_index = :shard_index AND attempt = :attempt "
    f"AND status = '{ShardStatus.LEASED}' AND spec_owner IS NULL "
    "RETURNING batch_id, shard_index, attempt, spec_owner, spec_expires_at, "
    "byte_start, byte_end, first_line, num_lines",
)

_SPEC_FENCE = (
    "WHERE batch_id = :batch_id AND shard_index = :shard_index AND attempt = :attempt "
    f"AND spec_owner = :worker_id AND status = '{ShardStatus.LEASED}'"
)

RENEW_SPECULATIVE = shared(
    "renew_speculative",
    f"UPDATE shards SET spec_expires_at = :lease_expires_at {_SPEC_FENCE}",
)

SPECULATIVE_HELD = shared("speculative_held", f"SELECT 1 FROM shards {_SPEC_FENCE}")

# The same row change as `COMMIT_SHARD`: once either holder committed, the shard is done and
# the other's fence (status = leased) no longer matches.
COMMIT_SPECULATIVE = shared(
    "commit_speculative",
    f"UPDATE shards SET status = '{ShardStatus.DONE}', output_key = :output_key, "
    "error_key = :error_key, num_completed = :num_completed, num_failed = :num_failed, "
    f"{_RAISE_PEAKS}, committed_at = :now, lease_expires_at = NULL, spec_owner = NULL, "
    f"spec_expires_at = NULL {_SPEC_FENCE} AND {live_lease('spec_expires_at')}",
)

# Only the speculative slot is freed; the original keeps running.
RELEASE_SPECULATIVE = shared(
    "release_speculative",
    f"UPDATE shards SET spec_owner = NULL, spec_expires_at = NULL {_SPEC_FENCE}",
)

# ---------------------------------------------------------------------------------------------
# Result cache and worker registry
# ---------------------------------------------------------------------------------------------

_CACHE_SELECT = "SELECT key, value FROM result_cache"

CACHE_GET_MANY = per_dialect(
    "cache_get_many",
    sqlite=f"{_CACHE_SELECT} WHERE {in_list('key', 'keys', Dialect.SQLITE)}",
    postgres=f"{_CACHE_SELECT} WHERE {in_list('key', 'keys', Dialect.POSTGRES)}",
)

CACHE_PUT = shared(
    "cache_put",
    "INSERT INTO result_cache (key, value) VALUES (:key, :value) ON CONFLICT (key) DO NOTHING",
)

UPSERT_WORKER = shared(
    "upsert_worker",
    "INSERT INTO workers (worker_id, address, models, capacity, load, last_heartbeat_at) "
    "VALUES (:worker_id, :address, :models, :capacity, :load, :now) "
    "ON CONFLICT (worker_id) DO UPDATE SET address = excluded.address, "
    "models = excluded.models, capacity = excluded.capacity, load = excluded.load, "
    "last_heartbeat_at = excluded.last_heartbeat_at",
)

LIST_WORKERS = shared(
    "list_workers",
    "SELECT worker_id, address, models, capacity, load, last_heartbeat_at "
    "FROM workers ORDER BY worker_id",
)

REMOVE_WORKER = shared("remove_worker", "DELETE FROM workers WHERE worker_id = :worker_id")
