"""The jobs subsystem of one process: its stores, the supervisor and the shard runners.

`start` opens the stores and launches named background tasks; `stop` sets their stop event,
lets running shards hand their leases back, and closes the stores. Writes that must finish
(commits, releases) are shielded, so a cancelled task cannot leave them half done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from conveyor.errors import ServiceUnavailable
from conveyor.jobs.config import JobsConfig
from conveyor.jobs.context import JobCounters, JobsContext
from conveyor.jobs.fair_share import FairShare
from conveyor.jobs.line_caller import RunRequest
from conveyor.jobs.message_batches import MessageBatches
from conveyor.jobs.object_stores import open_tenant_object_stores, tenant_object_store_urls
from conveyor.jobs.operations import JobOperations
from conveyor.jobs.runner import ShardRunner
from conveyor.jobs.stalls import StallReporter
from conveyor.jobs.store import AsyncJobStore
from conveyor.jobs.supervisor import Supervisor
from conveyor.stores import open_job_store, open_object_store
from conveyor.stores.timeouts import PostgresTimeouts
from conveyor.tenants.budget import MonthlyBudgets

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 8.0


class JobsSubsystem:
    """Owns the batch-job machinery of one process."""

    def __init__(
        self,
        config: JobsConfig,
        data_dir: Path,
        run_request: RunRequest,
        is_model_served: Callable[[str], bool],
        *,
        metrics: Any = None,
        can_run_model: Callable[[str], bool] | None = None,
        fair_share: FairShare | None = None,
        budgets: MonthlyBudgets | None = None,
        batch_queue_tokens: Callable[[str, str], int | None] | None = None,
        tenant_regions: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Nothing is opened before `start`.

        `can_run_model` says which models this process runs itself; its shard runners
        claim only shards of batches for those models (None: any model). `fair_share`
        splits the runners' claims among tenants (default: equal weights, one hour's
        half-life). `budgets` (read from this subsystem's store once started) pause a
        tenant's batch lines while its monthly budget is spent. `batch_queue_tokens(tenant,
        model)` bounds the input tokens of a tenant's active batches (None: unbounded).
        `tenant_regions` pins tenants to regions: shards of their batches are claimed only
        by a process whose `config.region` is one of them, and their files live in their
        first region's object store (`ConfigError` here when it has none).
        """
        self.config = config
        self._data_dir = data_dir
        self._run_request = run_request
        self._is_model_served = is_model_served
        self._can_run_model = can_run_model
        self._counters = JobCounters(metrics)
        self._fair_share = fair_share or FairShare()
        self.budgets = budgets or MonthlyBudgets({})
        self._batch_queue_tokens = batch_queue_tokens
        self._tenant_regions = dict(tenant_regions or {})
        self._object_store_url = config.object_store_url_for(data_dir)
        self._tenant_store_urls = tenant_object_store_urls(
            self._tenant_regions, config.region_object_store_urls, self._object_store_url
        )
        self._ctx: JobsContext | None = None
        self._api: JobOperations | None = None
        self._message_batches: MessageBatches | None = None
        self._shutdown = asyncio.Event()
        self._kick = asyncio.Event()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def api(self) -> JobOperations:
        """The file and batch operations (503 until started)."""
        if self._api is None:
            raise ServiceUnavailable("batch jobs are not available yet")
        return self._api

    @property
    def message_batches(self) -> MessageBatches:
        """Anthropic's Message Batches operations (503 until started)."""
        if self._message_batches is None:
            raise ServiceUnavailable("batch jobs are not available yet")
        return self._message_batches

    @property
    def context(self) -> JobsContext:
        """The shared context (after `start`)."""
        if self._ctx is None:
            raise RuntimeError("the jobs subsystem is not started")
        return self._ctx

    async def start(self) -> None:
        """Open the stores and start the supervisor and shard runners."""
        cfg = self.config
        timeouts = PostgresTimeouts(
            connect_timeout_s=cfg.job_store_connect_timeout_s,
            statement_timeout_ms=cfg.job_store_statement_timeout_ms,
            acquire_timeout_s=cfg.job_store_acquire_timeout_s,
        )
        store = await asyncio.to_thread(
            open_job_store, cfg.job_store_url_for(self._data_dir), postgres_timeouts=timeouts
        )
        objects = await asyncio.to_thread(
            open_tenant_object_stores,
            self._object_store_url, self._tenant_store_urls, open_object_store,
        )  # fmt: skip
        ctx = JobsContext(
            store=AsyncJobStore(store), objects=objects, config=cfg,
            worker_id=cfg.resolved_worker_id(),
            run_request=self._run_request, is_model_served=self._is_model_served,
            can_run_model=self._can_run_model, counters=self._counters,
            fair_share=self._fair_share,
            is_tenant_paused=self.budgets.is_over if self.budgets.has_budgets else None,
            batch_queue_tokens=self._batch_queue_tokens, tenant_regions=self._tenant_regions,
        )  # fmt: skip
        self.budgets.bind(store)
        self._ctx = ctx
        self._api = JobOperations(ctx, self._kick.set)
        self._message_batches = MessageBatches(ctx, self._kick.set)
        self._shutdown.clear()
        stalls = StallReporter(ctx)
        supervisor = Supervisor(ctx, self._wake, stalls)
        self._spawn("conveyor-jobs-supervisor", supervisor.run_forever(self._shutdown, self._kick))
        if cfg.is_worker:
            for index in range(cfg.num_shard_runners):
                runner = ShardRunner(ctx, self._wake, self._kick, stalls)
                self._spawn(f"conveyor-jobs-runner-{index}", runner.run_forever(self._shutdown))
        log.info("batch jobs started (worker %s)", ctx.worker_id)

    def _spawn(self, name: str, coro: Any) -> None:
        """Start a named background task and keep a reference to it."""
        self._tasks.append(asyncio.create_task(coro, name=name))

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the tasks (running shards are released, not lost) and close the stores."""
        await self.release(timeout_s)
        self._api = None
        self._message_batches = None
        if self._ctx is not None:
            self.budgets.bind(None)
            await self._ctx.store.close()
            self._ctx = None

    async def release(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the tasks, handing running shards back, and keep the stores open: a
        draining worker still answers its in-flight requests and writes their usage."""
        self._shutdown.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._tasks.clear()
