"""A one-shot worker (embeddings, synthetic): the real batching policy objects on the
virtual clock.

``BatchQueue`` (priority classes, closing rules), ``BatchTimeModel`` (the fitted t(n),
predicted waits, Retry-After), ``BatchSizeGovernor`` and ``mixed_batch_limit`` decide as in
``batching.batcher``; the model's time comes from the time model. Admission is the
batcher's: 429 when the class's queue is full, or when the predicted wait passes the
deadline once the fit is warm.
"""

from __future__ import annotations

from typing import Any, cast

from conveyor.batching.governor import BatchSizeGovernor
from conveyor.batching.item import WorkItem
from conveyor.batching.mix import mixed_batch_limit
from conveyor.batching.queue import BatchQueue
from conveyor.batching.timing import BatchTimeModel
from conveyor.plan.curves import LinearCurve
from conveyor.priority import Priority
from conveyor.sim.clock import Clock, Timer
from conveyor.sim.metrics import Metrics
from conveyor.sim.request import SimRequest
from conveyor.sim.scenario import BatchingSpec
from conveyor.sim.worker import TRANSPORT_ERROR, Reply

# Online traffic counts as present this long after its last input (the batcher's default).
ONLINE_RECENT_S = 1.0


class OneShotWorker:
    """One worker hosting one one-shot model."""

    def __init__(
        self, worker_id: str, region: str, clock: Clock, spec: BatchingSpec, curve: LinearCurve,
        metrics: Metrics, *, request_overhead_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.worker_id, self.region = worker_id, region
        self.is_alive = self.is_reachable = True
        self.slowdown = 1.0
        self._clock, self._spec, self._curve, self._metrics = clock, spec, curve, metrics
        self._overhead_s = request_overhead_s
        self.queue = BatchQueue(max_batch_size=spec.max_batch_size, max_batch_tokens=None,
                                max_queue=spec.max_queue)  # fmt: skip
        self.timing = BatchTimeModel()
        self.governor = BatchSizeGovernor(spec.max_batch_size)
        self._replies: dict[int, tuple[WorkItem, Reply]] = {}
        self._running: list[WorkItem] = []
        self._running_since = 0.0
        self._wake_timer: Timer | None = None
        self._last_online_s = -1e9
        self._epoch = 0

    def receive(self, request: SimRequest, reply: Reply) -> None:
        """Admit the input or refuse it at once, as ``Batcher.submit`` does."""
        if not self.is_alive:
            reply(request, TRANSPORT_ERROR, 0.0)
            return
        now = self._clock.now
        cap = self.governor.cap(now)
        if not self.queue.can_put(request.priority):
            reply(request, 429, self._retry_after_s(cap))
            return
        if self.timing.is_warm and (self._running or self.queue.num_queued):
            wait_s = self.timing.predicted_wait_s(
                self.queue.num_ahead_of(request.priority), cap, running_size=len(self._running),
                running_for_s=now - self._running_since,
            )  # fmt: skip
            if now + wait_s > request.deadline_s:
                reply(request, 429, self._retry_after_s(cap))
                return
        # No event loop here: the future is never used (the reply callback answers).
        item = WorkItem(request, request.num_prompt_tokens, request.priority, now,
                        request.deadline_s, cast(Any, None))  # fmt: skip
        self.queue.put(item)
        if request.priority is Priority.ONLINE:
            self._last_online_s = now
        self._replies[request.rid] = (item, reply)
        self._maybe_start()

    def _retry_after_s(self, cap: int) -> float:
        return float(max(1, -(-self.timing.drain_time_s(self.queue.num_queued, cap) // 1)))

    def abort(self, rid: int) -> None:
        """Drop an abandoned input if it has not run yet."""
        held = self._replies.get(rid)
        if held is not None and self.queue.drop(held[0]):
            del self._replies[rid]

    def _limit(self, cap: int) -> int:
        """The batcher's ``_batch_limit``: smaller batches while jobs wait beside online."""
        online = self._clock.now - self._last_online_s <= ONLINE_RECENT_S
        if not self.queue.num_queued_in(Priority.BATCH) or not online:
            return cap
        limit = mixed_batch_limit(cap, self.timing, slack_s=self._spec.mixed_batch_slack_ms / 1e3)
        return max(limit, min(cap, self.queue.num_queued_in(Priority.ONLINE)))

    def _maybe_start(self) -> None:
        if self._running or not self.is_alive:
            return
        now = self._clock.now
        cap = self._limit(self.governor.cap(now))
        max_wait_s = self._spec.max_wait_ms / 1e3
        if self.queue.ready_reason(now, max_wait_s, cap) is None:
            oldest = self.queue.oldest_enqueued_at()
            if oldest is not None and self._wake_timer is None:
                # A nanosecond late: ``now - oldest`` may round below ``max_wait_s`` at it.
                wake_s = oldest + max_wait_s + 1e-9
                self._wake_timer = self._clock.timer(wake_s, self._on_wake)
            return
        batch, _ = self.queue.take(cap)
        if not batch:
            return
        self._running, self._running_since = batch, now
        self._metrics.add("batches", now)
        self._metrics.add("batch_fill", now, len(batch) / self._spec.max_batch_size)
        model_s = self._curve.at(len(batch)) * self.slowdown
        self._clock.after(model_s, self._end_batch, batch, model_s, self._epoch)

    def _on_wake(self) -> None:
        self._wake_timer = None
        self._maybe_start()

    def _end_batch(self, batch: list[WorkItem], model_s: float, epoch: int) -> None:
        if epoch != self._epoch:
            return
        self.timing.observe(len(batch), model_s)
        self.timing.observe_cycle(len(batch), self._clock.now - self._running_since)
        self._running = []
        now = self._clock.now
        for item in batch:
            held = self._replies.pop(cast(SimRequest, item.payload).rid, None)
            if held is not None:
                request = cast(SimRequest, item.payload)
                request.first_token_s = now
                self._clock.after(self._overhead_s, held[1], request, 200, 0.0)
        self._maybe_start()

    def kill(self) -> list[tuple[SimRequest, Reply]]:
        """The process dies with its queue and its running batch."""
        self.is_alive = False
        self._epoch += 1
        lost = [(cast(SimRequest, item.payload), reply) for item, reply in self._replies.values()]
        self._replies.clear()
        return lost

    def load(self) -> dict[str, Any]:
        """The heartbeat's queue depth (``cli.worker.service_load``)."""
        return {"queue_depth": self.queue.num_queued, "running": len(self._running)}

    def sample(self, now_s: float) -> dict[str, float]:
        """Queue depth and running inputs."""
        return {"queue_depth": self.queue.num_queued, "running": len(self._running)}
