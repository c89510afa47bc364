"""A generative worker: Conveyor's real ``Scheduler`` and ``BlockManager``, stepped on the
virtual clock, each step timed by the time model.

Admission mirrors the generator's (``engine.generator``) through ``seat_gate``: 429 when
the queue is at ``max_queue``, or when the measured seat turnover says an online request
would get a seat only after its deadline; waiting online requests that turn late are shed
(``late_ones``) as the engine does. Sampled tokens are a constant: what a step costs does
not depend on which token it picked, and a request ends at its planned output length.
Runs of steps that only decode are timed at once and applied in bulk (``decode_run``),
with the same outcome as one step at a time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.job_share import JobShare, JobShareConfig
from conveyor.engine.core.prefix_digest import PrefixDigest
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.seat_turnover import late_ones
from conveyor.engine.core.sequence import Sequence
from conveyor.engine.core.step_plan import SchedulerOutput
from conveyor.fleet.model_load import generative_load
from conveyor.sim.clock import Clock
from conveyor.sim.decode_run import MIN_RUN_STEPS, DecodeRun, advance, silent_steps, step_ends
from conveyor.sim.metrics import Metrics
from conveyor.sim.request import SimRequest
from conveyor.sim.scenario import EngineSpec
from conveyor.sim.seat_gate import SeatGate
from conveyor.sim.step_loop import StepLoop
from conveyor.sim.timemodel import LlmStepTime
from conveyor.sim.worker import TRANSPORT_ERROR, Reply

SAMPLED_TOKEN = 7


@dataclass(slots=True)
class _Entry:
    request: SimRequest
    reply: Reply
    seq: Sequence
    admitted_s: float


class LlmWorker(StepLoop):
    """One worker hosting one generative model."""

    def __init__(
        self, worker_id: str, region: str, clock: Clock, spec: EngineSpec, timing: LlmStepTime,
        kv_tokens: int, metrics: Metrics, *, request_overhead_s: float = 0.0,
        keeps_digest: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(clock, SeatGate(spec.max_queue, spec.max_num_seqs))
        self.worker_id, self.region = worker_id, region
        self.is_reachable = True
        self._slowdown = 1.0
        self._spec, self._timing, self._metrics = spec, timing, metrics
        self._overhead_s = request_overhead_s
        blocks = max(1, kv_tokens // spec.block_size)
        self.blocks = BlockManager(blocks, spec.block_size)
        config = SchedulerConfig(spec.max_num_seqs, spec.max_num_batched_tokens,
                                 min(spec.max_model_len, blocks * spec.block_size))  # fmt: skip
        share = None
        if spec.job_tokens_beside_online is not None:
            share = JobShare(JobShareConfig(spec.job_tokens_beside_online), lambda: clock.now)
        self.scheduler = Scheduler(config, self.blocks, share)
        # Only prefix-aware routing reads the digest; a snapshot scans the whole pool.
        self.digest = PrefixDigest(clock=lambda: clock.now)
        self._keeps_digest = keeps_digest
        self._entries: dict[str, _Entry] = {}
        self._arrival = 0
        self.num_steps = 0
        self._run: DecodeRun | None = None
        self._fast_forward = spec.fast_forward and not keeps_digest

    @property
    def slowdown(self) -> float:
        """How much slower than the time model this worker steps (a straggler: 3)."""
        return self._slowdown

    @slowdown.setter
    def slowdown(self, factor: float) -> None:
        self.sync()
        self._slowdown = factor

    # -- admission ---------------------------------------------------------------------

    def receive(self, request: SimRequest, reply: Reply) -> None:
        """Admit the attempt or refuse it at once (429), as the generator does."""
        if not self.is_alive:
            reply(request, TRANSPORT_ERROR, 0.0)
            return
        self.sync()
        sched = self.scheduler
        retry_after_s = self.gate.refusal(request, self._clock.now, sched.num_waiting,
                                          sched.num_waiting_online)  # fmt: skip
        if retry_after_s is not None:
            reply(request, 429, retry_after_s)
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
        return self.gate.retry_after_s(self.scheduler.num_waiting)

    def abort(self, rid: int) -> None:
        """Free an abandoned request's seat and blocks."""
        self.sync()
        if self._entries.pop(str(rid), None) is not None:
            self.scheduler.abort(str(rid))

    # -- stepping ----------------------------------------------------------------------

    def _plan_step(self, now: float, epoch: int) -> bool:
        """Plan a step with the real scheduler and time it (or a run of decode steps)."""
        sched = self.scheduler
        out = sched.schedule() if sched.has_unfinished else None
        if out is None or out.is_empty:
            return False
        kv_tokens = 0
        for item in out.scheduled:
            kv_tokens += item.start_pos + item.num_new_tokens
        step_s = self._timing.step_s(out.num_batched_tokens, len(out.scheduled), kv_tokens)
        if out.preempted:
            self._metrics.add("preemptions", now, len(out.preempted))
        self._metrics.add("batched_tokens", now, out.num_batched_tokens)
        if not (self._fast_forward and self._run_ahead(out, step_s, kv_tokens, epoch)):
            self._clock.after(step_s * self._slowdown, self._end_step, out, epoch)
        return True

    # -- runs of decode steps (see ``decode_run``) -------------------------------------

    def _run_ahead(self, out: SchedulerOutput, step_s: float, kv_tokens: int, epoch: int) -> bool:
        """Start a run of decode steps with ``out`` first; False when it is not one."""
        num_seqs = len(out.scheduled)
        if out.num_batched_tokens != num_seqs or self.scheduler.num_waiting:
            return False  # a prefill chunk in the step, or an admission may come: not a run
        entries = self._entries
        left = {}
        for item in out.scheduled:
            entry = entries.get(item.seq.seq_id)
            if entry is None or entry.seq is not item.seq:
                return False
            left[entry.seq.seq_id] = entry.request.output_tokens - item.seq.num_output_tokens
        has_share = self._spec.job_tokens_beside_online is not None
        num_steps = silent_steps(out, self.scheduler, left, has_share)
        if num_steps < MIN_RUN_STEPS:
            return False
        ends = step_ends(self._timing, self._clock.now, step_s, self._slowdown,
                         len(out.scheduled), kv_tokens, num_steps)  # fmt: skip
        run = self._run = DecodeRun(out, ends)
        self._clock.at(ends[-1], self._end_run, run, epoch)
        return True

    def _end_run(self, run: DecodeRun, epoch: int) -> None:
        """The run's last step ended: apply it all, then plan the next step."""
        if epoch != self._epoch or self._run is not run:
            return
        self._run = None
        self._apply(run, run.num_steps)
        self._step(epoch)

    def _apply(self, run: DecodeRun, num_steps: int) -> None:
        """The run's first ``num_steps`` steps, with what each step's end and the next
        one's start did one at a time (shedding has nothing to shed: none wait)."""
        num_seqs = len(run.out.scheduled)

        def on_step(start_s: float) -> None:
            if self.gate.is_shed_due(start_s):
                self._shed_late(start_s)
            self._metrics.add("batched_tokens", start_s, num_seqs)

        advance(self.scheduler, run, num_steps, SAMPLED_TOKEN, on_step)
        self.num_steps += num_steps
        self.gate.turnover.on_queue(self.scheduler.num_waiting)

    def sync(self) -> None:
        """Apply the steps of a run ended by now and plan the one in flight with the real
        scheduler, before anything looks at this worker or changes it."""
        run = self._run
        if run is None:
            return
        self._run = None
        now, epoch = self._clock.now, self._epoch
        done = bisect.bisect_right(run.ends_s, now)
        if done == 0:
            self._clock.at(run.ends_s[0], self._end_step, run.out, epoch)
            return
        self._apply(run, done)
        if done == run.num_steps:  # its end is due now: plan the next step after it
            self._clock.at(run.ends_s[-1], self._step, epoch)
            return
        start_s = run.ends_s[done - 1]
        if self.gate.is_shed_due(start_s):
            self._shed_late(start_s)
        out = self.scheduler.schedule()
        self._metrics.add("batched_tokens", start_s, out.num_batched_tokens)
        self._clock.at(run.ends_s[done], self._end_step, out, epoch)

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
        self.gate.turnover.on_queue(sched.num_waiting)
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
        self.gate.on_finish(now, entry.admitted_s, self.scheduler.num_waiting)
        self._metrics.add("output_tokens", now, entry.seq.num_output_tokens)
        self._clock.after(self._overhead_s, entry.reply, entry.request, 200, 0.0)

    def _shed_late(self, now: float) -> None:
        """Refuse (429) waiting online requests that would get a seat after their deadline."""
        interval_s = self.gate.shed_interval_s(now)
        if interval_s is None:
            return
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
        self.sync()  # the steps done by now count; the one in flight dies
        self._stop_stepping()
        lost = [(entry.request, entry.reply) for entry in self._entries.values()]
        self._entries.clear()
        return lost

    def load(self) -> dict[str, Any]:
        """As a real worker reports a generative model (``cli.worker.generative_load``):
        sequences waiting plus running as its queue depth, the batch-job ones among them."""
        sched = self.scheduler
        return generative_load(sched.num_waiting, sched.num_running, sched.num_batch)

    def sample(self, now_s: float) -> dict[str, float]:
        """Waiting and running sequences, KV use."""
        self.sync()
        sched = self.scheduler
        return {"queue_depth": sched.num_waiting, "running": sched.num_running,
                "kv_use": self.blocks.usage}  # fmt: skip
