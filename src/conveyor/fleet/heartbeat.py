"""A worker's registration and heartbeat in the store's worker registry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.fleet.registry_store import AsyncWorkerRegistry, WorkerRegistryStore
from conveyor.stores.errors import StoreError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """What a worker advertises about itself: id, where to reach it, what it hosts."""

    worker_id: str
    address: str
    models: tuple[str, ...]
    capacity: int

    def __post_init__(self) -> None:
        """Reject identities the registry could not route to."""
        if not self.worker_id:
            raise ValueError("worker_id must be a non-empty string")
        if not self.address.startswith(("http://", "https://")):
            raise ValueError(f"address must be an http(s) URL, got {self.address!r}")
        if self.capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {self.capacity}")


LoadFn = Callable[[], Mapping[str, Any]]


class Heartbeat:
    """Upserts the worker's row every ``interval_s`` with its current load."""

    def __init__(
        self,
        store: WorkerRegistryStore,
        identity: WorkerIdentity,
        load: LoadFn,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._store = AsyncWorkerRegistry(store)
        self.identity = identity
        self._load = load
        self.interval_s = interval_s
        self._clock = clock
        self._stopping = asyncio.Event()
        self.num_beats = 0

    async def beat(self) -> None:
        """Send one heartbeat now (registers the worker on the first one)."""
        ident = self.identity
        await self._store.upsert_worker(
            ident.worker_id,
            ident.address,
            ident.models,
            ident.capacity,
            dict(self._load()),
            self._clock(),
        )
        self.num_beats += 1

    async def run(self) -> None:
        """Beat until ``stop``; a store hiccup is logged and retried on the next beat."""
        while not self._stopping.is_set():
            try:
                await self.beat()
            except StoreError as exc:
                log.warning("heartbeat failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)

    async def stop(self, running: asyncio.Task[None]) -> None:
        """End ``run`` after its current beat.

        Not a cancel: a cancelled beat's database write could still land after
        ``deregister`` and bring the row back.
        """
        self._stopping.set()
        await running

    async def deregister(self) -> None:
        """Remove the worker's row so gateways stop routing to it at their next refresh."""
        try:
            await self._store.remove_worker(self.identity.worker_id)
        except StoreError as exc:
            log.warning("deregistration failed (the row will go stale): %s", exc)
