"""The SQL job store: every aggregate over one database, plus the result cache and workers.

`SqlJobStore` implements `JobStore` (files, batches, shards, result cache, API keys, the
usage ledger, stored responses) and the fleet's worker registry protocol; the SQLite and
PostgreSQL backends subclass it and only supply connections, transactions and error
translation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.stores import sql_queries as q
from conveyor.stores.records import WorkerRecord
from conveyor.stores.sql_base import SqlStore
from conveyor.stores.sql_files import SqlBatchStore, SqlFileStore
from conveyor.stores.sql_keys import SqlApiKeyStore
from conveyor.stores.sql_models import SqlModelStore
from conveyor.stores.sql_responses import SqlResponseStore
from conveyor.stores.sql_shards import SqlShardStore
from conveyor.stores.sql_usage import SqlUsageStore


class SqlResultCache(SqlStore):
    """`ResultCacheStore` over SQL: one statement per batch of keys."""

    def cache_get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Return the cached value of each key that has one."""
        if not keys:
            return {}
        params = {"keys": q.list_param(keys, self._dialect)}
        return {key: bytes(value) for key, value in self._rows(q.CACHE_GET_MANY, params)}

    def cache_put_many(self, entries: Mapping[str, bytes]) -> None:
        """Store values under their keys in one transaction; present keys keep their value.

        Keys are content hashes, so an existing entry already holds the same value.
        """
        if any(not key for key in entries):
            raise ValueError("cache key must be a non-empty string")
        if not entries:
            return
        rows = [{"key": key, "value": bytes(value)} for key, value in entries.items()]
        with self._session(is_write=True) as session:
            session.execute_many(q.CACHE_PUT.text(self._dialect), rows)


class SqlWorkerRegistry(SqlStore):
    """The fleet's `WorkerRegistryStore` over SQL."""

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
        if not worker_id:
            raise ValueError("worker_id must be a non-empty string")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        params = {
            "worker_id": worker_id,
            "address": address,
            "models": json.dumps(list(models)),
            "capacity": capacity,
            "load": json.dumps(dict(load)),
            "now": float(now),
        }
        self._change(q.UPSERT_WORKER, params)

    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        """Return every registered worker with its heartbeat age and staleness flag.

        A worker is stale when its last heartbeat is more than `stale_after_s` old. Stale
        workers are listed too so a reaper can find and remove them; routers filter them out.
        """
        rows = self._rows(q.LIST_WORKERS, {})
        return [WorkerRecord.from_row(row, now, stale_after_s) for row in rows]

    def remove_worker(self, worker_id: str) -> bool:
        """Forget a worker; return whether it was registered."""
        return self._change(q.REMOVE_WORKER, {"worker_id": worker_id}) > 0


class SqlJobStore(
    SqlFileStore,
    SqlBatchStore,
    SqlShardStore,
    SqlResultCache,
    SqlWorkerRegistry,
    SqlApiKeyStore,
    SqlModelStore,
    SqlUsageStore,
    SqlResponseStore,
):
    """Every aggregate of the job store database over SQL; backends add the sessions."""
