"""A gateway: tenant limits, the real ``Router`` over the real ``FleetRegistry``, retries.

Per request, as ``gateway.forward.Proxy``: the tenant's token buckets (``MemoryRateLimiter``,
``bucket_asks``) answer 429 first; then the router picks a worker among the registry's
views; a failure before any answer (refused, reset, unreachable, 503) ejects the worker
(transport failures) and tries another, up to ``max_attempts`` and within the deadline;
the worker's 429 goes back to the caller. The deadline passing answers 504 and the worker
is told to drop the request. The registry reads the shared store every ``refresh_s``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import partial

from conveyor.fleet.affinity import AffinitySettings
from conveyor.fleet.registry import FleetRegistry
from conveyor.fleet.router import Ejections, Router, WorkerView
from conveyor.sim.clock import Clock
from conveyor.sim.metrics import Metrics
from conveyor.sim.request import Outcome, SimRequest
from conveyor.sim.scenario import FleetSpec
from conveyor.sim.store import SimStore
from conveyor.sim.worker import TRANSPORT_ERROR, SimWorker
from conveyor.stores.errors import StoreError
from conveyor.tenants.config import ModelLimits
from conveyor.tenants.gate import bucket_asks
from conveyor.tenants.limiter import MemoryRateLimiter

RETRIED_STATUSES = (TRANSPORT_ERROR, 503)


class SimGateway:
    """One gateway process."""

    def __init__(
        self, gateway_id: str, region: str, clock: Clock, spec: FleetSpec, store: SimStore,
        workers: Mapping[str, SimWorker], metrics: Metrics, rng: random.Random, *,
        hop_s: float, limits: Mapping[str, ModelLimits],
    ) -> None:  # fmt: skip
        self.gateway_id, self.region = gateway_id, region
        self.is_alive = True
        self._clock, self._spec, self._store = clock, spec, store
        self._workers, self._metrics, self._hop_s = workers, metrics, hop_s
        self._limits = limits
        self._model = spec.model.name
        self.registry = FleetRegistry(
            store,
            stale_after_s=spec.stale_after_s,
            reap_after_s=spec.reap_after_s,
            clock=lambda: clock.now,
            view_of=store.view_of,
        )
        affinity = None
        if spec.affinity is not None:
            a = spec.affinity
            affinity = AffinitySettings(a.load_bound, a.use_prefix, a.use_session)
        self.router = Router(rng, Ejections(spec.ejection_cooldown_s), affinity=affinity)
        self.limiter = MemoryRateLimiter()
        self._views: Sequence[WorkerView] = []
        self._in_flight: dict[int, SimRequest] = {}

    # -- the registry ------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the worker rows (a failing store keeps the last view), then again later."""
        if not self.is_alive:
            return
        now = self._clock.now
        try:
            records = self._store.list_workers(now, self._spec.stale_after_s)
            for dead in self.registry.adopt(records, now):
                self._store.remove_worker(dead.worker_id)
            views = self.registry.views
            if not self._spec.cross_region:
                views = [v for v in views if self._workers[v.worker_id].region == self.region]
            self._views = views
            self.router.ejections.forget_missing({v.worker_id for v in views})
        except StoreError:
            self.registry.on_read_failed()
            self._metrics.add("registry_read_failures", now)
        self._clock.after(self._spec.refresh_s, self.refresh)

    # -- requests ----------------------------------------------------------------------

    def handle(self, request: SimRequest) -> None:
        """A request arrives from a caller."""
        now = self._clock.now
        request.gateway_id = self.gateway_id
        limits = self._limits.get(request.tenant)
        if limits is not None and not limits.is_unlimited:
            asks = bucket_asks(limits, request.num_prompt_tokens, request.output_tokens)
            decision = self.limiter.take_now(f"{request.tenant}\x00{self._model}", asks, now)
            if not decision.is_admitted:
                retry = float(max(1, -(-decision.retry_after_s // 1)))
                self._metrics.add("tenant_429", now)
                self._metrics.answered(request, Outcome.REJECTED_429, now, retry)
                return
        self._in_flight[request.rid] = request
        # One lane a source: its requests' timeout is one, their deadlines come in order.
        request.deadline_timer = self._clock.timer(
            request.deadline_s, self._expire, request, lane=request.source
        )
        self._attempt(request)

    def _attempt(self, request: SimRequest) -> None:
        now = self._clock.now
        if len(request.tried) >= self._spec.max_attempts:
            self._finish(request, Outcome.FAILED_5XX, "no_worker")
            return
        view = self.router.choose(
            self._views, self._model, now, exclude=request.tried, affinity=request.affinity
        )
        if view is None:
            self._finish(request, Outcome.FAILED_5XX, "no_worker")
            return
        request.tried += (view.worker_id,)
        request.worker_id = view.worker_id
        self.router.acquire(view.worker_id)
        worker = self._workers[view.worker_id]
        reply = partial(self._on_reply, view.worker_id)
        if not worker.is_reachable:
            self._clock.after(self._spec.connect_timeout_s, reply, request, TRANSPORT_ERROR, 0.0)
        else:
            self._clock.after(self._hop_s, worker.receive, request, self._back(reply))

    def _back(self, reply: partial[None]) -> partial[None]:
        """The worker's answer, one hop later."""
        return partial(self._clock.after, self._hop_s, reply)

    def _on_reply(self, worker_id: str, request: SimRequest, status: int, retry_s: float) -> None:
        self.router.release(worker_id)
        if request.num_answers or not self.is_alive:
            return  # the caller already has its answer (504), or the gateway died
        if status in RETRIED_STATUSES:
            if status == TRANSPORT_ERROR:
                self.router.ejections.eject(worker_id, self._clock.now)
            self._metrics.add("retries", self._clock.now)
            self._attempt(request)
        elif status == 200:
            self._finish(request, Outcome.COMPLETED)
        elif status == 429:
            self._finish(request, Outcome.REJECTED_429, retry_s=retry_s)
        else:
            self._finish(request, Outcome.FAILED_5XX, f"status_{status}")

    def _expire(self, request: SimRequest) -> None:
        """The deadline passed before an answer: 504, and the worker drops the request."""
        request.deadline_timer = None
        if request.num_answers:
            return
        worker_id = request.worker_id
        if worker_id is not None:
            worker = self._workers[worker_id]
            self._clock.after(self._hop_s, worker.abort, request.rid)
        self._finish(request, Outcome.FAILED_5XX, "deadline")

    def _finish(
        self, request: SimRequest, outcome: Outcome, why: str = "", retry_s: float = 0.0
    ) -> None:
        now = self._clock.now
        self._in_flight.pop(request.rid, None)
        if request.deadline_timer is not None:
            request.deadline_timer.cancel()
            request.deadline_timer = None
        if why:
            self._metrics.add(f"5xx_{why}", now)
        self._metrics.answered(request, outcome, now, retry_s)
        if request.session is not None:
            request.session.on_answer(request, outcome)

    def kill(self) -> None:
        """The gateway dies: its callers' connections break (a 5xx each)."""
        self.is_alive = False
        for request in list(self._in_flight.values()):
            self._finish(request, Outcome.FAILED_5XX, "gateway_lost")
