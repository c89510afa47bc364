"""The gateway's view of the fleet: worker rows from the store, refreshed periodically."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.fleet.registry_store import AsyncWorkerRegistry, WorkerRegistryStore
from conveyor.fleet.router import WorkerView
from conveyor.observability.logs import log_event
from conveyor.prefix.report import PrefixHoldings, parse_prefix_report
from conveyor.stores.errors import StoreError
from conveyor.stores.records import WorkerRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """One model's state on one worker, as its heartbeat reported it."""

    queue_depth: int = 0
    service_per_s: float = 0.0
    is_loaded: bool = True
    # Batch-job lines among ``queue_depth`` (0 from workers that do not say).
    batch_depth: int = 0


def model_loads(record: WorkerRecord) -> dict[str, ModelLoad]:
    """Per-model load from a worker row; tolerant of missing fields (older workers)."""
    raw: Mapping[str, Any] = record.load.get("models", {})
    loads: dict[str, ModelLoad] = {}
    for name in record.models:
        entry: Mapping[str, Any] = raw.get(name, {})
        loads[name] = ModelLoad(
            queue_depth=int(entry.get("queue_depth", 0)),
            service_per_s=float(entry.get("service_per_s", 0.0)),
            is_loaded=bool(entry.get("is_loaded", True)),
            batch_depth=int(entry.get("batch_depth", 0)),
        )
    return loads


def view_from_record(record: WorkerRecord) -> WorkerView:
    """The routing view of a worker row."""
    loads = model_loads(record)
    return WorkerView(
        worker_id=record.worker_id,
        address=record.address,
        models=frozenset(record.models),
        loaded_models=frozenset(name for name, load in loads.items() if load.is_loaded),
        queue_depth={name: load.queue_depth for name, load in loads.items()},
        batch_depth={name: load.batch_depth for name, load in loads.items() if load.batch_depth},
        last_heartbeat_at=record.last_heartbeat_at,
        is_stale=record.is_stale,
        is_draining=bool(record.load.get("is_draining", False)),
        prefixes=_prefix_holdings(record),
        region=_region(record),
    )


def _region(record: WorkerRecord) -> str | None:
    """The region the worker's heartbeat named (None: none, or an older worker)."""
    region = record.load.get("region")
    return region if isinstance(region, str) and region else None


def _prefix_holdings(record: WorkerRecord) -> dict[str, PrefixHoldings]:
    """Per model, the prefix digest the worker's heartbeat carried (when it carried one)."""
    raw: Mapping[str, Any] = record.load.get("models", {})
    holdings = {}
    for name in record.models:
        entry: Any = raw.get(name, {})
        parsed = parse_prefix_report(entry.get("prefix") if isinstance(entry, Mapping) else None)
        if parsed is not None:
            holdings[name] = parsed
    return holdings


def _log_joined(before: list[WorkerRecord], after: list[WorkerRecord]) -> None:
    """A ``worker_joined`` event for each worker in ``after`` that was not in ``before``."""
    known = {record.worker_id for record in before}
    for record in after:
        if record.worker_id not in known:
            log_event(
                log, logging.INFO, "worker_joined",
                f"worker {record.worker_id} joined at {record.address}",
                worker_id=record.worker_id, address=record.address, models=list(record.models),
            )  # fmt: skip


class FleetRegistry:
    """Worker rows and their routing views, as of the last successful refresh.

    Rows whose heartbeat is older than ``reap_after_s`` are deleted from the store, so a
    worker killed without deregistering disappears for every gateway.

    The registry is *unsure* before its first read, while reads fail, and for
    ``stale_after_s`` after they come back: the store was down for the workers too, so
    their heartbeats failed and their rows look stale until each has beaten again (within
    that window, as a worker beats several times per ``stale_after_s``). While unsure it
    reaps nothing, and ``may_host`` still counts the models it was last sure of.
    """

    def __init__(
        self,
        store: WorkerRegistryStore,
        *,
        stale_after_s: float,
        reap_after_s: float,
        clock: Callable[[], float] = time.time,
        view_of: Callable[[WorkerRecord], WorkerView] = view_from_record,
    ) -> None:
        """``view_of`` builds a row's routing view (the simulator's shares the views of
        one read between its gateways)."""
        if stale_after_s <= 0 or reap_after_s < stale_after_s:
            raise ValueError("need 0 < stale_after_s <= reap_after_s")
        self._store = AsyncWorkerRegistry(store)
        self.stale_after_s = stale_after_s
        self.reap_after_s = reap_after_s
        self._clock = clock
        self._view_of = view_of
        self.records: list[WorkerRecord] = []
        self.views: list[WorkerView] = []
        self.num_refreshes = 0
        self.num_failed_refreshes = 0
        self._is_failing = False
        self._recovered_at: float | None = None
        # Models fresh workers hosted at the last refresh made while sure.
        self.sure_models: frozenset[str] = frozenset()

    @property
    def has_refreshed(self) -> bool:
        """True once the store has been read at least once."""
        return self.num_refreshes > 0

    def is_unsure(self, now: float | None = None) -> bool:
        """Whether missing or stale workers may be the store's fault rather than theirs."""
        if not self.has_refreshed or self._is_failing:
            return True
        return self._is_recovering(self._clock() if now is None else now)

    def _is_recovering(self, now: float) -> bool:
        return self._recovered_at is not None and now - self._recovered_at < self.stale_after_s

    def may_host(self, model: str) -> bool:
        """Whether, as far as an unsure registry knows, some worker hosts ``model``: one
        did when it was last sure, or a listed row (stale or not) does. Before the first
        read it knows nothing, so any model may be hosted."""
        if not self.has_refreshed or model in self.sure_models:
            return True
        return any(model in view.models for view in self.views)

    async def refresh(self) -> None:
        """Read the worker rows (off the event loop) and, when sure, reap the long-dead."""
        now = self._clock()
        try:
            records = await self._store.list_workers(now, self.stale_after_s)
            dead = self.adopt(records, now)
            for record in dead:
                await self._store.remove_worker(record.worker_id)
        except StoreError:
            self.on_read_failed()
            raise

    def on_read_failed(self) -> None:
        """A read of the store failed: unsure until it answers again (the last view stays)."""
        self._is_failing = True

    def adopt(self, records: list[WorkerRecord], now: float) -> list[WorkerRecord]:
        """Take rows just read at ``now`` as the view; return the rows to reap (none while
        unsure). Pure: the caller removes the returned rows from the store."""
        if self._is_failing:
            self._is_failing, self._recovered_at = False, now
        is_sure = not self._is_recovering(now)
        dead = [r for r in records if r.heartbeat_age_s > self.reap_after_s] if is_sure else []
        for record in dead:
            log_event(
                log, logging.INFO, "worker_reaped",
                f"reaped worker {record.worker_id} (silent for {record.heartbeat_age_s:.1f} s)",
                worker_id=record.worker_id,
            )  # fmt: skip
        alive = [r for r in records if r.heartbeat_age_s <= self.reap_after_s] if dead else records
        _log_joined(self.records, alive)
        self.records = alive
        self.views = [self._view_of(r) for r in alive]
        self.num_refreshes += 1
        if is_sure:
            self.sure_models = frozenset(m for v in self.views if not v.is_stale for m in v.models)
        return dead

    async def run(self, interval_s: float, on_refresh: Callable[[], None]) -> None:
        """Refresh every ``interval_s`` until cancelled; a failing store keeps the last view."""
        while True:
            try:
                await self.refresh()
                on_refresh()
            except StoreError as exc:
                self.num_failed_refreshes += 1
                log.warning("worker registry refresh failed: %s", exc)
            await asyncio.sleep(interval_s)
