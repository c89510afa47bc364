"""Versioned schema migrations, applied when a job store opens.

Each migration has a version number; `schema_version` records which ones ran. Opening a store
applies the missing ones in order inside the caller's transaction, so opening twice (or from two
processes at once, given the caller's lock) is harmless. Migrations are append-only: never edit
one that has shipped, add a new version instead.

DDL is written once with `{type}` slots filled per dialect, which keeps the few real differences
(auto-increment keys, binary and float types) in the table below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.stores.errors import StoreError
from conveyor.stores.sql_queries import Dialect, SqlSession
from conveyor.stores.sql_schema import CREATE_VERSION_TABLE, CURRENT_VERSION, RECORD_VERSION

# Column types that differ between the dialects.
_TYPES: dict[Dialect, dict[str, str]] = {
    Dialect.SQLITE: {
        # AUTOINCREMENT never reuses a value, so `seq` order is insertion order.
        "seq_pk": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "blob": "BLOB",
        "float": "REAL",
    },
    Dialect.POSTGRES: {
        "seq_pk": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "blob": "BYTEA",
        "float": "DOUBLE PRECISION",
    },
}

_V1_INITIAL = (
    # `seq` orders listings (newest first) and backs the `after` cursor; ids are random.
    """CREATE TABLE IF NOT EXISTS files (
        seq {seq_pk},
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        object_key TEXT NOT NULL,
        status TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, seq)",
    """CREATE TABLE IF NOT EXISTS batches (
        seq {seq_pk},
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL,
        status TEXT NOT NULL,
        metadata TEXT,
        model TEXT,
        created_at BIGINT NOT NULL,
        in_progress_at BIGINT,
        expires_at BIGINT,
        finalizing_at BIGINT,
        completed_at BIGINT,
        failed_at BIGINT,
        expired_at BIGINT,
        cancelling_at BIGINT,
        cancelled_at BIGINT,
        output_file_id TEXT,
        error_file_id TEXT,
        errors TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, seq)",
    "CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status, seq)",
    """CREATE TABLE IF NOT EXISTS shards (
        batch_id TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
        shard_index INTEGER NOT NULL,
        byte_start BIGINT NOT NULL,
        byte_end BIGINT NOT NULL,
        first_line BIGINT NOT NULL,
        num_lines BIGINT NOT NULL,
        status TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        lease_owner TEXT,
        lease_expires_at {float},
        output_key TEXT,
        error_key TEXT,
        num_completed BIGINT NOT NULL,
        num_failed BIGINT NOT NULL,
        started_at {float},
        committed_at {float},
        PRIMARY KEY (batch_id, shard_index)
    )""",
    """CREATE TABLE IF NOT EXISTS result_cache (
        key TEXT PRIMARY KEY,
        value {blob} NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS workers (
        worker_id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        models TEXT NOT NULL,
        capacity INTEGER NOT NULL,
        load TEXT NOT NULL,
        last_heartbeat_at {float} NOT NULL
    )""",
)


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: DDL templates whose `{type}` slots are filled per dialect."""

    version: int
    name: str
    statements: tuple[str, ...]

    def __post_init__(self) -> None:
        """Versions start at 1 (0 means an empty database)."""
        if self.version < 1:
            raise ValueError(f"migration versions start at 1, got {self.version}")

    def render(self, dialect: Dialect) -> list[str]:
        """Return the statements with the dialect's types filled in."""
        return [s.format(**_TYPES[dialect]) for s in self.statements]


# A second, speculative holder of a leased shard (straggler speculation): its owner and lease.
_V2_SPECULATION = (
    "ALTER TABLE shards ADD COLUMN spec_owner TEXT",
    "ALTER TABLE shards ADD COLUMN spec_expires_at {float}",
)

# API keys created by `conveyor keys`: only a SHA-256 digest (hex) and a display prefix.
_V3_API_KEYS = (
    """CREATE TABLE IF NOT EXISTS api_keys (
        seq {seq_pk},
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        digest TEXT NOT NULL UNIQUE,
        prefix TEXT NOT NULL,
        is_admin INTEGER NOT NULL,
        created_at BIGINT NOT NULL,
        last_used_at BIGINT,
        revoked_at BIGINT
    )""",
)

# Model distribution: pushed models' manifests, and which worker holds which chunk.
_V4_MODEL_DISTRIBUTION = (
    """CREATE TABLE IF NOT EXISTS model_manifests (
        name TEXT PRIMARY KEY,
        digest TEXT NOT NULL,
        total_bytes BIGINT NOT NULL,
        manifest TEXT NOT NULL,
        created_at {float} NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS chunk_holders (
        digest TEXT NOT NULL,
        worker_id TEXT NOT NULL,
        address TEXT NOT NULL,
        zone TEXT,
        state TEXT NOT NULL,
        updated_at {float} NOT NULL,
        PRIMARY KEY (digest, worker_id)
    )""",
    "CREATE INDEX IF NOT EXISTS chunk_holders_by_worker ON chunk_holders (worker_id)",
)

# The usage ledger (tenant, model, minute) and each committed shard's tokens (Batch `usage`).
_V5_USAGE = (
    """CREATE TABLE IF NOT EXISTS usage_minutes (
        tenant TEXT NOT NULL,
        model TEXT NOT NULL,
        minute_start BIGINT NOT NULL,
        num_requests BIGINT NOT NULL,
        input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        model_s {float} NOT NULL,
        cost_usd {float} NOT NULL,
        PRIMARY KEY (tenant, minute_start, model)
    )""",
    "CREATE INDEX IF NOT EXISTS usage_by_minute ON usage_minutes (minute_start)",
    "ALTER TABLE shards ADD COLUMN input_tokens BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE shards ADD COLUMN output_tokens BIGINT NOT NULL DEFAULT 0",
)

# File expiry (`expires_after` on upload, `output_expires_after` on a batch's result files).
_V6_FILE_EXPIRY = (
    "ALTER TABLE files ADD COLUMN expires_at BIGINT",
    "CREATE INDEX IF NOT EXISTS files_by_expiry ON files (expires_at)",
    "ALTER TABLE batches ADD COLUMN output_expires_after_s BIGINT",
)

# A batch's estimated input tokens, held against its tenant's batch_queue_tokens while active.
_V7_QUEUED_TOKENS = (
    "ALTER TABLE batches ADD COLUMN queued_input_tokens BIGINT NOT NULL DEFAULT 0",
)

# Each shard's highest reported counts, kept across attempts: a batch's counts never go back.
_V8_PEAK_COUNTS = (
    "ALTER TABLE shards ADD COLUMN peak_completed BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE shards ADD COLUMN peak_failed BIGINT NOT NULL DEFAULT 0",
)

# Stored responses (Responses API): the Response object and input items as JSON text, and a
# background response's runnable request with the lease of the worker running it.
_V9_RESPONSES = (
    """CREATE TABLE IF NOT EXISTS responses (
        seq {seq_pk},
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        model TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        body TEXT NOT NULL,
        input_items TEXT NOT NULL,
        job TEXT,
        attempt INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_expires_at {float}
    )""",
    "CREATE INDEX IF NOT EXISTS responses_by_status ON responses (status, seq)",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _V1_INITIAL),
    Migration(2, "speculative shard attempts", _V2_SPECULATION),
    Migration(3, "api keys", _V3_API_KEYS),
    Migration(4, "model manifests and chunk holders", _V4_MODEL_DISTRIBUTION),
    Migration(5, "usage ledger", _V5_USAGE),
    Migration(6, "file expiry", _V6_FILE_EXPIRY),
    Migration(7, "batch queued input tokens", _V7_QUEUED_TOKENS),
    Migration(8, "shard peak counts", _V8_PEAK_COUNTS),
    Migration(9, "stored responses", _V9_RESPONSES),
)

LATEST_VERSION = MIGRATIONS[-1].version


def current_version(session: SqlSession, dialect: Dialect) -> int:
    """Return the highest applied migration version (0 for an empty database)."""
    session.execute(CREATE_VERSION_TABLE.text(dialect), {})
    rows = session.query(CURRENT_VERSION.text(dialect), {})
    return int(rows[0][0])


def apply_migrations(
    session: SqlSession, dialect: Dialect, migrations: Sequence[Migration] = MIGRATIONS
) -> list[int]:
    """Apply every migration newer than the recorded version, in order.

    The caller runs this inside one write transaction that also serialises concurrent openers.
    Returns the versions applied (empty when the schema was already current).
    """
    versions = [m.version for m in migrations]
    if versions != sorted(set(versions)):
        raise ValueError(f"migration versions must be unique and ascending: {versions}")
    done = current_version(session, dialect)
    if versions and done > versions[-1]:
        # Older code must not write into a schema it does not understand.
        raise StoreError(f"database schema version {done} is newer than this code ({versions[-1]})")
    applied: list[int] = []
    for migration in migrations:
        if migration.version <= done:
            continue
        for statement in migration.render(dialect):
            session.execute(statement, {})
        session.execute(
            RECORD_VERSION.text(dialect), {"version": migration.version, "name": migration.name}
        )
        applied.append(migration.version)
    return applied
