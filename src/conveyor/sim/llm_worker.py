"""A generative worker: Conveyor's real ``Scheduler`` and ``BlockManager``, stepped on the
virtual clock, each step timed by the time model.

Admission mirrors the generator's (``engine.generator``): 429 when the waiting queue is at
``max_queue``, or when the measured seat turnover (``SeatTurnover``) says an online request
would get a seat only after its deadline; waiting online requests that turn late are shed
(``late_ones``) as the engine does. Sampled tokens are a constant: what a step costs does
not depend on which token it picked, and a request ends at its planned output length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.job_share import JobShare, JobShareConfig
from conveyor.engine.core.prefix_digest import PrefixDigest
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.seat_turnover import SeatTurnover, late_ones
from conveyor.engine.core.sequence import Sequence
from conveyor.engine.core.step_plan import SchedulerOutput
from conveyor.priority import Priority
from conveyor.sim.clock import Clock
from conveyor.sim.metrics import Metrics
from conveyor.sim.request import SimRequest
from conveyor.sim.scenario import EngineSpec
from conveyor.sim.timemodel import LlmStepTime
from conveyor.sim.worker import TRANSPORT_ERROR, Reply

SAMPLED_TOKEN = 7
# As the engine: late waiting requests are looked for at most this often.
SHED_EVERY_S = 0.025
RUN_TIME_SMOOTHING = 0.1


@dataclass(slots=True)
class _Entry:
    request: SimRequest
    reply: Reply
    seq: Sequence
    admitted_s: float


class LlmWorker:
    """One worker hosting one generative model."""

    def __init__(
        self, worker_id: str, region: str, clock: Clock, spec: EngineSpec, timing: LlmStepTime,
        kv_tokens: int, metrics: Metrics, *, request_overhead_s: float = 0.0,
        keeps_digest: bool = False,
    ) -> None:  # fmt: skip
        self.worker_id, self.region = worker_id, region
        self.is_alive = self.is_reachable = True
        self.slowdown = 1.0
        self._clock, self._spec, self._timing, self._metrics = clock, spec, timing, metrics
        self._overhead_s = request_overhead_s
        blocks = max(1, kv_tokens // spec.block_size)
        self.blocks = BlockManager(blocks, spec.block_size)
        config = SchedulerConfig(spec.max_num_seqs, spec.max_num_batched_tokens,
                                 min(spec.max_model_len, blocks * spec.block_size))  # fmt: skip
        share = None
        if spec.job_tokens_beside_online is not None:
            share = JobShare(JobShareConfig(spec.job_tokens_beside_online), lambda: clock.now)
        self.scheduler = Scheduler(config, self.blocks, share)
        self.turnover = SeatTurnover()
        # Only prefix-aware routing reads the digest; a snapshot scans the whole pool.
        self.digest = PrefixDigest(clock=lambda: clock.now)
        self._keeps_digest = keeps_digest
        self._entries: dict[str, _Entry] = {}
        self._arrival = 0
        self._epoch = 0
        self._is_stepping = False
        self._next_shed_s = 0.0
        self._mean_run_s = 0.0
        self.num_steps = 0

    # -- admission ---------------------------------------------------------------------

    def receive(self, request: SimRequest, reply: Reply) -> None:
        """Admit the attempt or refuse it at once (429), as the generator does."""
        if not self.is_alive:
            reply(request, TRANSPORT_ERROR, 0.0)
            return
        sched = self.scheduler
        if request.priority is Priority.ONLINE:
            if sched.num_waiting + 1 > self._spec.max_queue:
                reply(request, 429, self._retry_after_s())
                return
            wait_s = self.turnover.predicted_wait_s(sched.num_waiting_online)
            if wait_s is not None and wait_s > request.deadline_s - self._clock.now:
                reply(request, 429, self._retry_after_s())
                return
        self._arrival += 1
        seq = Sequence(str(request.rid), request.prompt_ids, request.priority, self._arrival)
        if seq.num_tokens + request.output_tokens > sched.config.max_model_len:
            reply(request, 400, 0.0)
            return
        sched.add(seq)
        self._entries[seq.seq_id] = _Entry(request, reply, seq, self._clock.now)
        self._wake()

    def _retry_after_s(self) -> float:
        """As the engine's ``estimated_drain_s``, at least a second."""
        interval_s = self.turnover.mean_interval_s
        waiting = self.scheduler.num_waiting
        if interval_s is not None:
            drain_s = waiting * interval_s
        else:
            seats = self._spec.max_num_seqs
            drain_s = math.ceil(waiting / seats) * max(self._mean_run_s, 0.1)
        return float(max(1, round(drain_s)))

    def abort(self, rid: int) -> None:
        """Free an abandoned request's seat and blocks."""
        if self._entries.pop(str(rid), None) is not None:
            self.scheduler.abort(str(rid))

    # -- stepping ----------------------------------------------------------------------

    def _wake(self) -> None:
        if not self._is_stepping and self.is_alive:
            self._is_stepping = True
            self._clock.after(0.0, self._step, self._epoch)

    def _step(self, epoch: int) -> None:
        """Plan a step with the real scheduler and time it."""
        if epoch != self._epoch:
            return
        now = self._clock.now
        if now >= self._next_shed_s:
            self._shed_late(now)
        sched = self.scheduler
        out = sched.schedule() if sched.has_unfinished else None
        if out is None or out.is_empty:
            self._is_stepping = False
            return
        kv_tokens = 0
        for item in out.scheduled:
            kv_tokens += item.start_pos + item.num_new_tokens
        step_s = self._timing.step_s(out.num_batched_tokens, len(out.scheduled), kv_tokens)
        if out.preempted:
            self._metrics.add("preemptions", now, len(out.preempted))
        self._metrics.add("batched_tokens", now, out.num_batched_tokens)
        self._clock.after(step_s * self.slowdown, self._end_step, out, epoch)

    def _end_step(self, out: SchedulerOutput, epoch: int) -> None:
        """Apply the step: advance sequences, deliver first tokens and finished requests."""
        if epoch != self._epoch:
            return
        self.num_steps += 1
        sampled = {item.seq.seq_id: SAMPLED_TOKEN for item in out.scheduled if item.needs_logits}
        sched = self.scheduler
        capped = sched.postprocess(out, sampled)
        now = self._clock.now
        for item in out.scheduled:
            if item.needs_logits:
                self._on_token(item.seq, now)
        for seq in capped:
            if self._entries.get(seq.seq_id) is not None:
                self._retire(seq.seq_id, now)
        self.turnover.on_queue(sched.num_waiting)
        if self._keeps_digest:
            self.digest.refresh(self.blocks)
        self._step(epoch)

    def _on_token(self, seq: Sequence, now: float) -> None:
        entry = self._entries.get(seq.seq_id)
        if entry is None or entry.seq is not seq:
            return  # aborted since the step was planned
        request = entry.request
        if request.first_token_s is None:
            request.first_token_s = now
            self._metrics.add("prompt_tokens", now, seq.num_prompt_tokens)
            self._metrics.add("prefix_hit_tokens", now, seq.num_cached_tokens)
        if seq.num_output_tokens >= request.output_tokens:
            self._retire(seq.seq_id, now)

    def _retire(self, seq_id: str, now: float) -> None:
        entry = self._entries.pop(seq_id)
        self.scheduler.finish(seq_id)
        self.turnover.on_finish(now, self.scheduler.num_waiting)
        run_s = now - entry.admitted_s
        self._mean_run_s += RUN_TIME_SMOOTHING * (run_s - self._mean_run_s)
        self._metrics.add("output_tokens", now, entry.seq.num_output_tokens)
        self._clock.after(self._overhead_s, entry.reply, entry.request, 200, 0.0)

    def _shed_late(self, now: float) -> None:
        """Refuse (429) waiting online requests that would get a seat after their deadline."""
        interval_s = self.turnover.mean_interval_s
        if interval_s is None:
            return
        self._next_shed_s = now + SHED_EVERY_S
        waiting = self.scheduler.waiting_online()
        deadlines = [self._entries[seq.seq_id].request.deadline_s for seq in waiting]
        for index in late_ones(deadlines, now, interval_s):
            entry = self._entries.pop(waiting[index].seq_id)
            self.scheduler.abort(waiting[index].seq_id)
            self._metrics.add("shed", now)
            entry.reply(entry.request, 429, self._retry_after_s())

    # -- faults and reports ------------------------------------------------------------

    def kill(self) -> list[tuple[SimRequest, Reply]]:
        """Stop stepping; hand back every request in flight (their blocks die with it)."""
        self.is_alive = False
        self._epoch += 1
        lost = [(entry.request, entry.reply) for entry in self._entries.values()]
        self._entries.clear()
        return lost

    def load(self) -> dict[str, Any]:
        """As a real worker reports a generative model: queue depth 0 (its engine keeps its
        own queue, which the heartbeat does not count), plus the prefix digest."""
        return {"in_flight": len(self._entries), "is_draining": False}

    def sample(self, now_s: float) -> dict[str, float]:
        """Waiting and running sequences, KV use."""
        sched = self.scheduler
        return {"queue_depth": sched.num_waiting, "running": sched.num_running,
                "kv_use": self.blocks.usage}  # fmt: skip
