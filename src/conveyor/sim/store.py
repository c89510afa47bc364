"""The shared store: Conveyor's in-memory job store and worker registry, with an outage switch.

``MemoryJobStore`` is the store the product's own tests use (the same claims, fences and
lease expiry as the SQL store). The simulation reaches it directly (no thread hop) and can
take it down: while ``is_down``, every call raises ``StoreError`` as an unreachable
database would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from conveyor.fakes.job_store import MemoryJobStore
from conveyor.stores.errors import StoreError
from conveyor.stores.records import ShardLease, WorkerRecord


class SimStore:
    """The registry and shard calls the simulation makes, failing during an outage."""

    def __init__(self) -> None:
        self.store = MemoryJobStore()
        self.is_down = False

    def _check(self) -> None:
        if self.is_down:
            raise StoreError("store unreachable (simulated outage)")

    def upsert_worker(
        self, worker_id: str, address: str, models: Sequence[str], capacity: int,
        load: Mapping[str, Any], now: float,
    ) -> None:  # fmt: skip
        """Register or refresh a worker row."""
        self._check()
        self.store.upsert_worker(worker_id, address, models, capacity, load, now)

    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        """Every worker row, aged as of ``now``."""
        self._check()
        return self.store.list_workers(now, stale_after_s)

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker."""
        self._check()
        return self.store.remove_worker(worker_id)

    def close(self) -> None:
        """Nothing to release."""

    def claim_shard(
        self, worker_id: str, now: float, lease_s: float, batch_ids: Iterable[str]
    ) -> ShardLease | None:
        """Lease a claimable shard of the given batches."""
        self._check()
        return self.store.claim_shard(worker_id, now, lease_s, batch_ids)

    def renew_lease(self, lease: ShardLease, now: float, lease_s: float) -> bool:
        """Extend a held lease."""
        self._check()
        return self.store.renew_lease(lease, now, lease_s)

    def commit_shard(self, lease: ShardLease, now: float, num_completed: int) -> bool:
        """Mark the shard done if the lease still holds."""
        self._check()
        return self.store.commit_shard(lease, now, None, None, num_completed, 0)
