"""The per-model dynamic batcher: one queue, one model thread, results to futures.

The event loop only waits: batches run on the model's own thread and come back
through ``run_in_executor``. While batch N runs, inputs keep queueing; when it
finishes, batch N+1 is handed to the model before N's results are delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from conveyor.batching.governor import BatchSizeGovernor
from conveyor.batching.isolate import run_isolated
from conveyor.batching.item import ItemState, WorkItem
from conveyor.batching.mix import mixed_batch_limit
from conveyor.batching.queue import BatchQueue, CloseReason
from conveyor.batching.timing import BatchTimeModel
from conveyor.errors import DeadlineExceeded, QueueFull, ServiceUnavailable
from conveyor.observability.batches import batch_done, batch_taken
from conveyor.observability.logs import log_event
from conveyor.observability.metrics import ModelMetrics
from conveyor.priority import Priority
from conveyor.tenants.usage import split_by_tokens

log = logging.getLogger(__name__)

RunBatch = Callable[[list[Any]], Sequence[Any]]


@dataclass(slots=True, frozen=True)
class BatcherSettings:
    """The knobs of one batcher (mirrors a model's batching config)."""

    max_batch_size: int
    max_wait_ms: float
    max_batch_tokens: int | None
    max_queue: int
    oom_probe_interval_s: float = 30.0
    mixed_batch_slack_ms: float = 5.0
    # Online traffic counts as present for this long after the last online arrival.
    online_recent_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_wait_ms < 0:
            raise ValueError("max_wait_ms must be >= 0")
        if self.mixed_batch_slack_ms < 0 or self.online_recent_s < 0:
            raise ValueError("mixed_batch_slack_ms and online_recent_s must be >= 0")


@dataclass(slots=True)
class _Outcome:
    results: list[Any]
    # None when the run failed outside the model: no time was measured.
    model_s: float | None


class Batcher:
    """Groups inputs for one model into batches and returns each result to its caller."""

    def __init__(
        self,
        name: str,
        run_batch: RunBatch,
        settings: BatcherSettings,
        metrics: ModelMetrics,
        *,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        self.metrics = metrics
        self.queue = BatchQueue(
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_queue=settings.max_queue,
        )
        self.governor = BatchSizeGovernor(
            settings.max_batch_size, probe_interval_s=settings.oom_probe_interval_s
        )
        self.timing = BatchTimeModel()
        self._run_batch = run_batch
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix=f"model-{name}")
        self._owns_executor = executor is None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._is_stopping = False
        self._last_online_at = -math.inf
        self.num_running = 0
        # The batch running now and when it was taken, on the monotonic clock: uvloop's
        # loop time is read once per loop turn, and under a flood a turn is milliseconds.
        self._running: list[WorkItem] | None = None
        self._running_since = 0.0

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run_forever(), name=f"batcher-{self.name}")

    async def stop(self, *, drain_timeout_s: float = 30.0) -> None:
        """Stop taking inputs, let the running batch finish, fail what is still queued."""
        self._is_stopping = True
        self._wakeup.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), drain_timeout_s)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        while self.queue.num_queued:
            items, _ = self.queue.take(self.settings.max_batch_size)
            for item in items:
                item.resolve(ServiceUnavailable("the service is shutting down"))
        self._gauge_queue()
        if self._owns_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # -- admission -------------------------------------------------------
    def submit(
        self, payload: Any, num_tokens: int, priority: Priority, deadline: float
    ) -> WorkItem:
        """Admit one input or raise at once: 429 when the queue is full or when the
        predicted wait would pass the deadline (both are load; an admitted input that
        then misses its deadline is the 504).

        ``deadline`` is on the event loop's clock (``loop.time()``).
        """
        loop = self._require_loop()
        if self._is_stopping:
            raise ServiceUnavailable("the service is shutting down")
        now = loop.time()
        cap = self.governor.cap(now)
        if not self.queue.can_put(priority):
            raise QueueFull(
                f"model {self.name!r} queue is full "
                f"({self.queue.max_queue} {priority.name.lower()} inputs waiting)",
                retry_after_s=self.retry_after_s(cap),
            )
        if self.timing.is_warm and not self.is_idle:
            self._refuse_if_late(priority, cap, now, deadline)
        item = WorkItem(payload, num_tokens, priority, now, deadline, loop.create_future())
        self.queue.put(item)
        if priority is Priority.ONLINE:
            self._last_online_at = now
        if math.isfinite(deadline):  # a timer at infinity would only sit in the loop's heap
            item.timer = loop.call_at(deadline, self._expire, item)
        self._gauge_queue()
        self._wakeup.set()
        return item

    @property
    def is_idle(self) -> bool:
        """Nothing queued and nothing running: an input would start at once.

        An idle model admits every input; only its own deadline timer can still fail it.
        """
        return self.num_running == 0 and self.queue.num_queued == 0

    def _refuse_if_late(self, priority: Priority, cap: int, now: float, deadline: float) -> None:
        """429 when the predicted wait (the running batch, then the queue ahead) passes
        ``deadline``: the model is over capacity for this deadline, so a retry once the
        queue has drained can succeed."""
        wait_s = self.timing.predicted_wait_s(
            self.queue.num_ahead_of(priority), cap,
            running_size=self.num_running, running_for_s=time.monotonic() - self._running_since,
        )  # fmt: skip
        if now + wait_s > deadline:
            raise QueueFull(
                f"model {self.name!r} is over capacity: the predicted wait "
                f"({wait_s * 1000:.0f} ms) exceeds the request's deadline "
                f"({max(0.0, deadline - now) * 1000:.0f} ms left)",
                retry_after_s=self.retry_after_s(cap),
                code="deadline_unreachable",
            )

    def abandon(self, item: WorkItem) -> None:
        """The caller left: drop the input if it has not run yet."""
        if self.queue.drop(item):
            self._gauge_queue()
        item.resolve(asyncio.CancelledError())

    def retry_after_s(self, cap: int) -> int:
        """Seconds until the queue has drained, from depth and measured service time."""
        drain_s = self.timing.drain_time_s(self.queue.num_queued, cap)
        return max(1, math.ceil(drain_s))

    def _expire(self, item: WorkItem) -> None:
        item.timer = None
        if self.queue.drop(item):
            self._gauge_queue()
            item.resolve(DeadlineExceeded("the request waited past its deadline"))
        elif item.state is ItemState.RUNNING:
            item.resolve(DeadlineExceeded("the request's deadline passed while it ran"))

    # -- the loop --------------------------------------------------------
    async def _run_forever(self) -> None:
        pending: tuple[list[WorkItem], asyncio.Future[_Outcome]] | None = None
        while True:
            if pending is None:
                next_batch = await self._next_batch()
                if next_batch is None:
                    return
                pending = (next_batch, self._launch(next_batch))
            batch, future = pending
            try:
                outcome = await future
            except Exception as exc:  # the executor itself failed: fail the batch, keep going
                log.exception("batch failed outside the model")
                outcome = _Outcome([exc] * len(batch), None)
            self._note_cycle(batch, outcome)
            pending = None
            ready = None if self._is_stopping else self._take_if_ready()
            if ready is not None:
                pending = (ready, self._launch(ready))
            self._deliver(batch, outcome)

    def _note_cycle(self, batch: list[WorkItem], outcome: _Outcome) -> None:
        """Teach the timing model how long the batch held the model as the loop saw it."""
        if outcome.model_s is not None:
            self.timing.observe_cycle(len(batch), time.monotonic() - self._running_since)

    async def _next_batch(self) -> list[WorkItem] | None:
        """The next batch once one should close; None when stopping."""
        loop = self._require_loop()
        max_wait_s = self.settings.max_wait_ms / 1000
        while not self._is_stopping:
            ready = self._take_if_ready()
            if ready is not None:
                return ready
            self._wakeup.clear()
            oldest = self.queue.oldest_enqueued_at()
            if oldest is None:
                await self._wakeup.wait()
                continue
            timeout_s = max(0.0, oldest + max_wait_s - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout_s)
        return None

    def _take_if_ready(self) -> list[WorkItem] | None:
        now = self._require_loop().time()
        cap = self._batch_limit(self.governor.cap(now))
        reason = self.queue.ready_reason(now, self.settings.max_wait_ms / 1000, cap)
        if reason is None:
            return None
        batch, reason = self.queue.take(cap)
        if not batch:
            return None
        self._record_batch(batch, reason, now)
        return batch

    def _batch_limit(self, cap: int) -> int:
        """``cap``, or less while job inputs wait beside online traffic (``batching.mix``)."""
        if not self.queue.num_queued_in(Priority.BATCH) or not self._has_online_traffic():
            return cap
        limit = mixed_batch_limit(
            cap, self.timing, slack_s=self.settings.mixed_batch_slack_ms / 1000
        )
        # A burst of online inputs is not split to make room for job inputs.
        return max(limit, min(cap, self.queue.num_queued_in(Priority.ONLINE)))

    def _has_online_traffic(self) -> bool:
        """Online inputs wait now, or one arrived within ``online_recent_s``."""
        if self.queue.num_queued_in(Priority.ONLINE):
            return True
        recent_s = self.settings.online_recent_s
        return self._require_loop().time() - self._last_online_at <= recent_s

    def _record_batch(self, batch: list[WorkItem], reason: CloseReason, now: float) -> None:
        m = self.metrics
        m.batches_closed[reason.value].inc()
        m.batch_inputs.observe(len(batch))
        m.batch_tokens.observe(len(batch) * max(item.num_tokens for item in batch))
        m.batch_fill.observe(len(batch) / self.settings.max_batch_size)
        for item in batch:
            m.queue_wait_s.observe(now - item.enqueued_at)
        batch_taken(batch, now)
        self.num_running = len(batch)
        self._running = batch
        self._running_since = time.monotonic()
        m.in_flight.set(len(batch))
        self._gauge_queue()

    def _launch(self, batch: list[WorkItem]) -> asyncio.Future[_Outcome]:
        payloads = [item.payload for item in batch]
        cap = self.governor.cap(self._require_loop().time())
        return self._require_loop().run_in_executor(self._executor, self._run_sync, payloads, cap)

    def _run_sync(self, payloads: list[Any], cap: int) -> _Outcome:
        """On the model thread: run with bisection and OOM halving."""
        started = time.perf_counter()
        results = run_isolated(self._run_batch, payloads, cap=cap, on_oom=self._on_oom)
        return _Outcome(results, time.perf_counter() - started)

    def _on_oom(self, batch_size: int) -> int:
        self.metrics.oom_backoffs.inc()
        new_cap = self.governor.on_oom(batch_size, time.monotonic())
        log_event(
            log, logging.WARNING, "oom_backoff",
            f"model {self.name} out of memory at batch {batch_size}; cap now {new_cap}",
            model=self.name, batch_size=batch_size, new_cap=new_cap,
        )  # fmt: skip
        return new_cap

    def _deliver(self, batch: list[WorkItem], outcome: _Outcome) -> None:
        model_s = outcome.model_s
        if model_s is not None:  # a run that failed outside the model teaches the fit nothing
            self.timing.observe(len(batch), model_s)
            self.metrics.model_s.observe(model_s)
            self.metrics.inputs_processed.inc(len(batch))
            self.metrics.service_rate.set(self.timing.service_rate(self.settings.max_batch_size))
        # The next batch may already run (it starts before this one's results go out).
        if self._running is batch:
            self._running = None
            self.num_running = 0
            self.metrics.in_flight.set(0)
        batch_done(self.name, batch, model_s or 0.0, self._require_loop().time())
        shares_s = split_by_tokens(model_s or 0.0, [item.num_tokens for item in batch])
        for item, result, share_s in zip(batch, outcome.results, shares_s, strict=True):
            item.model_s = share_s
            item.resolve(result)

    def _gauge_queue(self) -> None:
        self.metrics.queue_depth_online.set(self.queue.num_queued_in(Priority.ONLINE))
        self.metrics.queue_depth_batch.set(self.queue.num_queued_in(Priority.BATCH))

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError(f"batcher {self.name} is not started")
        return self._loop
