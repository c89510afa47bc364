"""The shared store: Conveyor's in-memory job store and worker registry, with an outage switch.

``MemoryJobStore`` is the store the product's own tests use (the same claims, fences and
lease expiry as the SQL store). The simulation reaches it directly (no thread hop) and can
take it down: while ``is_down``, every call raises ``StoreError`` as an unreachable
database would.

Every gateway reads every worker row each refresh, all at the same simulated instants:
at 40 gateways and 2,400 workers, building the rows and their routing views again for
each gateway cost more than the requests. A read at the instant of the last one, with no
row written since, gets the rows that one built, and ``view_of`` the views built of them:
the same rows and views, built once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from conveyor.fakes.job_store import MemoryJobStore
from conveyor.fleet.registry import view_from_record
from conveyor.fleet.router import WorkerView
from conveyor.stores.errors import StoreError
from conveyor.stores.records import ShardLease, WorkerRecord


class SimStore:
    """The registry and shard calls the simulation makes, failing during an outage."""

    def __init__(self) -> None:
        self.store = MemoryJobStore()
        self.is_down = False
        self._rows_version = 0  # worker rows written so far
        # The last read: (when, stale after, version), its rows, and their views by id.
        self._read: tuple[float, float, int] | None = None
        self._rows: list[WorkerRecord] = []
        self._views: dict[int, tuple[WorkerRecord, WorkerView]] = {}

    def _check(self) -> None:
        if self.is_down:
            raise StoreError("store unreachable (simulated outage)")

    def upsert_worker(
        self, worker_id: str, address: str, models: Sequence[str], capacity: int,
        load: Mapping[str, Any], now: float,
    ) -> None:  # fmt: skip
        """Register or refresh a worker row."""
        self._check()
        self._rows_version += 1
        self.store.upsert_worker(worker_id, address, models, capacity, load, now)

    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        """Every worker row, aged as of ``now`` (the last read's rows when nothing changed)."""
        self._check()
        read = (now, stale_after_s, self._rows_version)
        if read != self._read:
            self._read, self._views = read, {}
            self._rows = self.store.list_workers(now, stale_after_s)
        return list(self._rows)

    def view_of(self, record: WorkerRecord) -> WorkerView:
        """``view_from_record``, built once for a row of the last read."""
        known = self._views.get(id(record))
        if known is not None and known[0] is record:
            return known[1]
        view = view_from_record(record)
        self._views[id(record)] = (record, view)
        return view

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker."""
        self._check()
        self._rows_version += 1
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
