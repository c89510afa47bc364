"""Durable storage for the Files and Batches API: a job store and an object store.

The job store (SQLite or PostgreSQL) holds files, batches, shards, the result cache and the
worker registry as references; the object store (local directory or S3) holds the bytes.

Layers, top down: the protocols (`protocols`, one per aggregate; `object_store`), the SQL
store built from named queries (`sql_store` on `sql_base`, `sql_queries`), and the backends
(`sqlite_store`, `postgres_store`; `local_store`, `s3_store`), which only this package's
factories import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.stores.errors import (
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
    StoreError,
    StoreUnavailableError,
)
from conveyor.stores.object_store import ObjectStore, open_object_store
from conveyor.stores.protocols import (
    MAX_BATCHES_PAGE,
    MAX_FILES_PAGE,
    BatchStore,
    FileStore,
    JobStore,
    ModelStore,
    ResultCacheStore,
    ShardStore,
)
from conveyor.stores.records import (
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
    new_batch_id,
    new_file_id,
)

if TYPE_CHECKING:
    from conveyor.stores.sql_store import SqlJobStore
    from conveyor.stores.timeouts import PostgresTimeouts

__all__ = [
    "MAX_BATCHES_PAGE",
    "MAX_FILES_PAGE",
    "BatchError",
    "BatchRecord",
    "BatchStatus",
    "BatchStore",
    "FileRecord",
    "FileStore",
    "JobStore",
    "ModelStore",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailableError",
    "RequestCounts",
    "ResultCacheStore",
    "ShardLease",
    "ShardRecord",
    "ShardSpec",
    "ShardStatus",
    "ShardStore",
    "StoreError",
    "StoreUnavailableError",
    "WorkerRecord",
    "new_batch_id",
    "new_file_id",
    "open_job_store",
    "open_object_store",
]


def open_job_store(url: str, *, postgres_timeouts: PostgresTimeouts | None = None) -> SqlJobStore:
    """Open (and migrate) the job store at `url`.

    `sqlite:///abs/path.db` or `sqlite://relative/path.db` (parent directories are created),
    or `postgresql://user@host:port/dbname` (libpq URL; `postgres_timeouts` bound its waits).
    The store serves every aggregate: `JobStore` and the fleet's worker registry.
    """
    if url.startswith("sqlite:"):
        # Imported here so each backend's driver loads only when used.
        from conveyor.stores.sqlite_store import SqliteJobStore

        return SqliteJobStore.from_url(url)
    if url.startswith(("postgresql://", "postgres://")):
        from conveyor.stores.postgres_store import PostgresJobStore

        return PostgresJobStore(url, timeouts=postgres_timeouts)
    raise ValueError(f"unsupported job store URL (want sqlite:// or postgresql://): {url!r}")
