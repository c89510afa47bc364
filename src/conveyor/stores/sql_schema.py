"""The SQL of schema versions: the version table and the PostgreSQL migration lock.

Used by `migrations` (and the PostgreSQL store's opener); the aggregates' SQL is in
`sql_queries`.
"""

from __future__ import annotations

from conveyor.stores.sql_queries import shared

CREATE_VERSION_TABLE = shared(
    "create_version_table",
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, name TEXT NOT NULL)",
)

CURRENT_VERSION = shared(
    "current_version", "SELECT CAST(COALESCE(MAX(version), 0) AS INTEGER) FROM schema_version"
)

RECORD_VERSION = shared(
    "record_version", "INSERT INTO schema_version (version, name) VALUES (:version, :name)"
)

# Serialises concurrent openers of one PostgreSQL database while they migrate; SQLite gets the
# same effect from BEGIN IMMEDIATE.
LOCK_FOR_MIGRATION = shared("lock_for_migration", "SELECT pg_advisory_xact_lock(:lock_key)")
