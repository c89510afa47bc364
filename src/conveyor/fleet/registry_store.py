"""The worker registry's store: the protocol the fleet needs and its async facade.

Workers upsert their row on every heartbeat; gateways list the rows to route and remove the
long-dead ones. The SQL job store implements the protocol in the same database as the jobs
(`conveyor.stores.sql_store.SqlWorkerRegistry`); `conveyor.fakes` does in memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from conveyor.stores.records import WorkerRecord


class WorkerRegistryStore(Protocol):
    """Registered workers, their advertised state and their last heartbeat."""

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
        """Return every registered worker with its heartbeat age and staleness flag.

        A worker is stale when its last heartbeat is more than `stale_after_s` old. Stale
        workers are listed too so a reaper can find and remove them.
        """
        ...

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker; return whether it was registered."""
        ...

    def close(self) -> None:
        """Release connections; later calls raise StoreError."""
        ...


class AsyncWorkerRegistry:
    """Awaitable registry calls, each run in a worker thread (one hop per call)."""

    def __init__(self, blocking: WorkerRegistryStore) -> None:
        """Wrap `blocking`, the store every call is delegated to."""
        self.blocking = blocking

    async def upsert_worker(
        self,
        worker_id: str,
        address: str,
        models: Sequence[str],
        capacity: int,
        load: Mapping[str, Any],
        now: float,
    ) -> None:
        """Register a worker or refresh its heartbeat and advertised state."""
        await asyncio.to_thread(
            self.blocking.upsert_worker, worker_id, address, models, capacity, load, now
        )

    async def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        """Every registered worker, aged as of `now`."""
        return await asyncio.to_thread(self.blocking.list_workers, now, stale_after_s)

    async def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker; whether it was registered."""
        return await asyncio.to_thread(self.blocking.remove_worker, worker_id)
