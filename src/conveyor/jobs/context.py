"""What every part of the jobs subsystem shares: stores, settings, the clock, the executor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conveyor.jobs.config import JobsConfig
from conveyor.jobs.fair_share import FairShare
from conveyor.jobs.line_caller import RetryPolicy, RunRequest, Sleep
from conveyor.jobs.object_stores import TenantObjectStores
from conveyor.jobs.store import AsyncJobStore

_T = TypeVar("_T")


class JobCounters:
    """Prometheus children for batch jobs (no-ops without a registry, e.g. in unit tests)."""

    def __init__(self, metrics: Any = None) -> None:
        """Bind to `conveyor.observability.metrics.Metrics` families when given."""
        self._metrics = metrics
        self.num_cache_hits = 0
        self.num_lines = {"completed": 0, "failed": 0}
        self.num_store_errors: dict[tuple[str, str], int] = {}
        self.num_stalled: dict[tuple[str, str], int] = {}

    def cache_hit(self, count: int = 1) -> None:
        """Lines answered from the result cache."""
        self.num_cache_hits += count
        if self._metrics is not None:
            self._metrics.batch_cache_hits.inc(count)

    def line_done(self, outcome: str, count: int = 1) -> None:
        """Lines that ran to a record (`completed` or `failed`)."""
        self.num_lines[outcome] += count
        if self._metrics is not None:
            self._metrics.batch_lines.labels(outcome).inc(count)

    def store_error(self, store: str, operation: str) -> None:
        """A background operation failed in `store` (it is retried later)."""
        key = (store, operation)
        self.num_store_errors[key] = self.num_store_errors.get(key, 0) + 1
        if self._metrics is not None:
            self._metrics.store_errors.labels(store, operation).inc()

    def stalled(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Batches this process sees stalled now, per (store, reason)."""
        self.num_stalled = dict(counts)
        if self._metrics is not None:
            for (store, reason), count in counts.items():
                self._metrics.batches_stalled.labels(store, reason).set(count)


@dataclass(slots=True)
class JobsContext:
    """Shared state of one process's jobs subsystem."""

    store: AsyncJobStore
    # Pick a tenant's with ``objects.for_tenant`` (residency keeps pinned tenants' files home).
    objects: TenantObjectStores
    config: JobsConfig
    worker_id: str
    run_request: RunRequest
    is_model_served: Callable[[str], bool]
    can_run_model: Callable[[str], bool] | None = None
    clock: Callable[[], float] = time.time
    sleep: Sleep = asyncio.sleep
    counters: JobCounters = field(default_factory=JobCounters)
    fair_share: FairShare = field(default_factory=FairShare)
    # Whether a tenant's batch lines must wait (e.g. its monthly budget is spent).
    is_tenant_paused: Callable[[str], Awaitable[bool]] | None = None
    # A tenant's bound on its active batches' input tokens for a model (None: unbounded).
    batch_queue_tokens: Callable[[str, str], int | None] | None = None
    # The regions each resident tenant is pinned to (``config.region`` must be one of them).
    tenant_regions: Mapping[str, Collection[str]] = field(default_factory=dict)

    def may_run_tenant(self, tenant: str) -> bool:
        """Whether this process may run ``tenant``'s batch lines (its residency allows)."""
        pinned = self.tenant_regions.get(tenant)
        return pinned is None or self.config.region in pinned

    @property
    def retry(self) -> RetryPolicy:
        """Backoff for transient line failures."""
        cfg = self.config
        return RetryPolicy(cfg.max_line_retries, cfg.retry_base_s, cfg.retry_max_s)


async def wait_for_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` passed; True if it was set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True


async def wait_for_any(events: list[asyncio.Event], timeout_s: float) -> None:
    """Wait until one of `events` is set or `timeout_s` passed."""
    if any(event.is_set() for event in events):
        return
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def shielded(call: Callable[[], Awaitable[_T]]) -> _T:
    """Run `call` so that cancelling the caller does not interrupt it half-way."""
    return await asyncio.shield(asyncio.ensure_future(call()))
