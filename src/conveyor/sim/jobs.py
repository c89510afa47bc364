"""Batch jobs: shards in the real store, claimed by lease in fair-share order, run line by
line through the workers' schedulers at batch priority, committed only while the lease
holds.

Each worker has a runner, as ``jobs.runner`` does: it ranks the tenants with ``FairShare``
(its own, per process), claims a shard with ``claim_shard`` (the store's lease rules:
``jobs.leases.is_live``), renews the lease every ``renew_every_s`` and commits when every
line answered. A worker that dies stops renewing; once the lease expires another runner
claims the shard again (a new attempt) and the dead attempt's commit could never land.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import partial

from conveyor.jobs.fair_share import FairShare
from conveyor.priority import Priority
from conveyor.sim.clock import Clock
from conveyor.sim.metrics import Metrics
from conveyor.sim.request import SimRequest
from conveyor.sim.scenario import TrafficSpec
from conveyor.sim.store import SimStore
from conveyor.sim.traffic import Prompts
from conveyor.sim.worker import SimWorker
from conveyor.stores.errors import StoreError
from conveyor.stores.records import BatchRecord, BatchStatus, ShardLease, ShardSpec

POLL_S = 1.0
LINE_DEADLINE_S = 24 * 3600.0


class BatchJob:
    """One batch of ``lines`` lines, its shards in the store, and its commits counted."""

    def __init__(self, spec: TrafficSpec, index: int, store: SimStore, now: float) -> None:
        self.spec = spec
        self.batch_id = f"batch_sim{index}"
        store.store.create_batch(BatchRecord(
            id=self.batch_id, tenant=spec.tenant, endpoint="/v1/chat/completions",
            input_file_id="file-sim", completion_window="24h", created_at=int(now),
            status=BatchStatus.IN_PROGRESS,
        ))  # fmt: skip
        specs, first = [], 0
        for index_ in range((spec.lines + spec.shard_lines - 1) // spec.shard_lines):
            num = min(spec.shard_lines, spec.lines - first)
            specs.append(ShardSpec(index_, first, first + num, first, num))
            first += num
        store.store.add_shards(self.batch_id, specs)
        self.num_shards = len(specs)
        self.lines_of = {s.index: s.num_lines for s in specs}
        self.commits: Counter[int] = Counter()
        self.finished_at_s: float | None = None

    @property
    def lines_committed(self) -> int:
        """Lines of shards committed at least once."""
        return sum(self.lines_of[i] for i in self.commits)

    @property
    def shards_committed_twice(self) -> int:
        """Shards whose output was committed more than once (must be 0)."""
        return sum(1 for n in self.commits.values() if n > 1)


@dataclass(slots=True)
class _Attempt:
    lease: ShardLease
    job: BatchJob
    next_line: int = 0
    num_done: int = 0
    num_running: int = 0
    is_lost: bool = False
    requests: list[SimRequest] = field(default_factory=list)


class JobRunner:
    """A worker's shard runner."""

    def __init__(
        self, worker: SimWorker, clock: Clock, store: SimStore, jobs: list[BatchJob],
        metrics: Metrics, prompts: Prompts,
    ) -> None:  # fmt: skip
        self.worker, self._clock, self._store = worker, clock, store
        self._jobs, self._metrics, self._prompts = jobs, metrics, prompts
        self.fair_share = FairShare(weights={})
        self._attempt: _Attempt | None = None

    def start(self, at_s: float) -> None:
        """Begin polling for shards at ``at_s``."""
        self._clock.at(at_s, self._poll)

    def _poll(self) -> None:
        if not self.worker.is_alive or self._attempt is not None:
            return
        try:
            claimed = self._claim()
        except StoreError:
            claimed = False
        if not claimed:
            self._clock.after(POLL_S, self._poll)

    def _claim(self) -> bool:
        """Lease a shard of the neediest tenant (``jobs.claims.claim_fairly``)."""
        now = self._clock.now
        by_tenant: dict[str, list[BatchJob]] = {}
        for job in self._jobs:
            if job.finished_at_s is None and job.spec.start_s <= now:
                by_tenant.setdefault(job.spec.tenant, []).append(job)
        for tenant in self.fair_share.order(by_tenant, now):
            jobs = {job.batch_id: job for job in by_tenant[tenant]}
            lease = self._store.claim_shard(self.worker.worker_id, now, _lease_s(jobs), jobs)
            if lease is not None:
                self.fair_share.charge(tenant, lease.num_lines, now)
                attempt = _Attempt(lease, jobs[lease.batch_id])
                self._attempt = attempt
                self._metrics.add("shards_claimed", now)
                self._clock.after(attempt.job.spec.renew_every_s, self._renew, attempt)
                self._feed(attempt)
                return True
        return False

    def _feed(self, attempt: _Attempt) -> None:
        """Keep ``lines_in_flight`` lines of the shard in the worker's scheduler."""
        spec = attempt.job.spec
        while (
            not attempt.is_lost and attempt.num_running < spec.lines_in_flight
            and attempt.next_line < attempt.lease.num_lines
        ):  # fmt: skip
            attempt.next_line += 1
            attempt.num_running += 1
            request = self._prompts.line(spec, self._clock.now, LINE_DEADLINE_S)
            request.priority = Priority.BATCH
            self.worker.receive(request, partial(self._on_line, attempt))

    def _on_line(self, attempt: _Attempt, request: SimRequest, status: int, retry_s: float) -> None:
        if not self.worker.is_alive or attempt is not self._attempt:
            return
        if status == 429:  # the worker's queue is full: send the line again later
            self._clock.after(retry_s, self._retry_line, attempt, request)
            return
        attempt.num_running -= 1
        attempt.num_done += 1
        self._metrics.add("lines_done", self._clock.now)
        if attempt.num_done == attempt.lease.num_lines:
            self._commit(attempt)
        else:
            self._feed(attempt)

    def _retry_line(self, attempt: _Attempt, request: SimRequest) -> None:
        if self.worker.is_alive and attempt is self._attempt:
            self.worker.receive(request, partial(self._on_line, attempt))

    def _renew(self, attempt: _Attempt) -> None:
        if attempt is not self._attempt or not self.worker.is_alive:
            return
        spec = attempt.job.spec
        try:
            held = self._store.renew_lease(attempt.lease, self._clock.now, spec.lease_s)
        except StoreError:
            held = True  # the next renewal may still make it before the lease ends
        if not held:
            self._drop(attempt, "leases_lost")
            return
        self._clock.after(spec.renew_every_s, self._renew, attempt)

    def _commit(self, attempt: _Attempt) -> None:
        now, job = self._clock.now, attempt.job
        try:
            is_committed = self._store.commit_shard(attempt.lease, now, attempt.num_done)
        except StoreError:
            is_committed = False
        if is_committed:
            job.commits[attempt.lease.index] += 1
            self._metrics.add("lines_committed", now, attempt.lease.num_lines)
            if len(job.commits) == job.num_shards and job.finished_at_s is None:
                job.finished_at_s = now
            self._attempt = None
            self._clock.after(0.0, self._poll)
        else:
            self._drop(attempt, "commits_refused")

    def _drop(self, attempt: _Attempt, why: str) -> None:
        attempt.is_lost = True
        self._metrics.add(why, self._clock.now)
        self._metrics.add("lines_wasted", self._clock.now, attempt.num_done)
        self._attempt = None
        self._clock.after(POLL_S, self._poll)

    def on_death(self) -> None:
        """The worker died: the attempt is abandoned (its lease will expire)."""
        if self._attempt is not None:
            self._metrics.add("lines_wasted", self._clock.now, self._attempt.num_done)
        self._attempt = None


def _lease_s(jobs: dict[str, BatchJob]) -> float:
    return min(job.spec.lease_s for job in jobs.values())
