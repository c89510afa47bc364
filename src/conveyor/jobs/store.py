"""The job store as the jobs package's async code sees it: one awaitable call, one thread hop.

Store calls block (a database round trip), so the event loop must not make them itself.
`AsyncJobStore` runs each call in a worker thread; code already on a thread (finalizing,
planning, committing) uses the blocking store, `AsyncJobStore.blocking`, directly. Batch
transitions go through `transition`, which checks the edge against the lifecycle first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ParamSpec, TypeVar

from conveyor.jobs.leases import check_transition
from conveyor.stores.protocols import MAX_FILES_PAGE, JobStore, ListOrder, StragglerPolicy
from conveyor.stores.records import BatchRecord, BatchStatus, FileRecord, ShardLease, ShardStatus

_P = ParamSpec("_P")
_R = TypeVar("_R")


def transition(
    store: JobStore,
    batch_id: str,
    from_statuses: Iterable[BatchStatus],
    to_status: BatchStatus,
    now: float,
    **fields: object,
) -> bool:
    """Blocking: a lifecycle-checked compare-and-set of a batch's status (see `BatchStore`)."""
    sources = list(from_statuses)
    check_transition(sources, to_status)
    return store.transition(batch_id, sources, to_status, now, **fields)


class AsyncJobStore:
    """Awaitable job store calls, each run in a worker thread."""

    def __init__(self, blocking: JobStore) -> None:
        """Wrap `blocking`, the store every call is delegated to."""
        self.blocking = blocking

    async def _call(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Run one blocking store call in a worker thread."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- files -----------------------------------------------------------------------------

    async def create_file(self, rec: FileRecord) -> None:
        """Insert a file record (its bytes are already in the object store)."""
        await self._call(self.blocking.create_file, rec)

    async def get_file(self, tenant: str, file_id: str) -> FileRecord | None:
        """The tenant's file, or None."""
        return await self._call(self.blocking.get_file, tenant, file_id)

    async def list_files(
        self,
        tenant: str,
        purpose: str | None,
        after: str | None,
        limit: int = MAX_FILES_PAGE,
        *,
        order: ListOrder = "desc",
    ) -> list[FileRecord]:
        """The tenant's files newest first (oldest first for `asc`), after the file id `after`."""
        return await self._call(
            self.blocking.list_files, tenant, purpose, after, limit, order=order
        )

    async def delete_file(self, tenant: str, file_id: str) -> bool:
        """Delete the tenant's file record; whether it existed."""
        return await self._call(self.blocking.delete_file, tenant, file_id)

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(self, rec: BatchRecord) -> None:
        """Insert a batch."""
        await self._call(self.blocking.create_batch, rec)

    async def get_batch(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """The tenant's batch, or None."""
        return await self._call(self.blocking.get_batch, tenant, batch_id)

    async def get_batch_any(self, batch_id: str) -> BatchRecord | None:
        """A batch regardless of tenant, or None."""
        return await self._call(self.blocking.get_batch_any, batch_id)

    async def list_batches(
        self,
        tenant: str,
        after: str | None,
        limit: int,
        *,
        order: ListOrder = "desc",
        endpoint: str | None = None,
    ) -> list[BatchRecord]:
        """The tenant's batches newest first (oldest first for `asc`), after the id `after`;
        with `endpoint`, only that endpoint's."""
        return await self._call(
            self.blocking.list_batches, tenant, after, limit, order=order, endpoint=endpoint
        )

    async def delete_batch(self, tenant: str, batch_id: str) -> bool:
        """Delete the tenant's batch and its shards; whether it existed."""
        return await self._call(self.blocking.delete_batch, tenant, batch_id)

    async def batches_in_status(self, statuses: Iterable[BatchStatus]) -> list[BatchRecord]:
        """Every batch in one of `statuses`, oldest first."""
        return await self._call(self.blocking.batches_in_status, list(statuses))

    async def transition(
        self,
        batch_id: str,
        from_statuses: Iterable[BatchStatus],
        to_status: BatchStatus,
        now: float,
        **fields: object,
    ) -> bool:
        """A lifecycle-checked compare-and-set of the batch's status (see `transition`)."""
        sources = list(from_statuses)
        check_transition(sources, to_status)  # a programming error: raise before the hop
        return await self._call(
            self.blocking.transition, batch_id, sources, to_status, now, **fields
        )

    # -- shards ----------------------------------------------------------------------------

    async def claim_shard(
        self, worker_id: str, now: float, lease_s: float, batch_ids: Sequence[str] | None
    ) -> ShardLease | None:
        """Lease one claimable shard, or None."""
        return await self._call(self.blocking.claim_shard, worker_id, now, lease_s, batch_ids)

    async def claim_speculative(
        self, worker_id: str, now: float, lease_s: float, policy: StragglerPolicy
    ) -> ShardLease | None:
        """Lease a speculative run of a straggler, or None."""
        return await self._call(self.blocking.claim_speculative, worker_id, now, lease_s, policy)

    async def release_shard(self, lease: ShardLease) -> bool:
        """Give a leased shard back."""
        return await self._call(self.blocking.release_shard, lease)

    async def count_shards(self, batch_id: str) -> dict[ShardStatus, int]:
        """The number of the batch's shards in each status."""
        return await self._call(self.blocking.count_shards, batch_id)

    # -- result cache ----------------------------------------------------------------------

    async def cache_get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The cached value of each key that has one (one round trip)."""
        return await self._call(self.blocking.cache_get_many, keys)

    async def cache_put_many(self, entries: Mapping[str, bytes]) -> None:
        """Store values under their keys (one round trip)."""
        await self._call(self.blocking.cache_put_many, entries)

    async def close(self) -> None:
        """Release the store's connections."""
        await self._call(self.blocking.close)
