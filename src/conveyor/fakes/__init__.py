"""In-memory fakes of the store protocols, and tiny checkpoints, for tests and scripts.

`MemoryJobStore` implements every job store aggregate (files, batches, shards with their
leases, the result cache) and the fleet's worker registry; `MemoryObjectStore` implements
`ObjectStore`. They keep the real stores' contracts (the same store tests run on them, on
SQLite and on PostgreSQL) but nothing survives the process, so never serve with them.
`MemoryJobStore` is put together from one module per aggregate (`shards`, `api_keys`,
`usage`, `models`: model manifests and chunks, `responses`: stored responses). `checkpoints`
writes tiny, randomly initialised Hugging Face checkpoints offline; it imports torch, so it
is not imported here.
"""

from __future__ import annotations

from conveyor.fakes.job_store import MemoryJobStore
from conveyor.fakes.objects import MemoryObjectStore

__all__ = ["MemoryJobStore", "MemoryObjectStore"]
