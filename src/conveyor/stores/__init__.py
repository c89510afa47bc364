"""Durable storage for the Files and Batches API: a job store and an object store.

The job store (SQLite or PostgreSQL) holds files, batches, shards, the result cache and the
worker registry as references; the object store (local directory or S3) holds the bytes.
"""

from conveyor.stores.job_store import JobStore, StoreError, open_job_store
from conveyor.stores.object_store import ObjectNotFoundError, ObjectStore, open_object_store
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
    can_transition,
    new_batch_id,
    new_file_id,
)

__all__ = [
    "BatchError",
    "BatchRecord",
    "BatchStatus",
    "FileRecord",
    "JobStore",
    "ObjectNotFoundError",
    "ObjectStore",
    "RequestCounts",
    "ShardLease",
    "ShardRecord",
    "ShardSpec",
    "ShardStatus",
    "StoreError",
    "WorkerRecord",
    "can_transition",
    "new_batch_id",
    "new_file_id",
    "open_job_store",
    "open_object_store",
]
