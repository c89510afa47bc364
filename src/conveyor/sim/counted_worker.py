"""A generative worker kept as counts (``engine.decode_model: counted``), for fleets too
large to step every sequence.

The exact worker (``llm_worker``) runs the real ``Scheduler`` and ``BlockManager`` every
step, which costs per running sequence and step; this one plans steps with the same rules
over token counts (``counted_engine``; decoding sequences in ``counted_pool``), so a step
costs O(1) plus the sequences that start, finish or are preempted in it. Each step is
timed by the same time model from aggregates (tokens computed, sequences, KV tokens
read). It still drives the real ``SeatTurnover`` (the 429 on arrival), sheds waiting
requests that turned late as the engine's ``late_ones`` does (``counted_queue``, over an
array of their deadlines) and reports its load with ``generative_load``. Online traffic
only, no prefix cache: a scenario needing either is refused (``check_counted``).
"""

from __future__ import annotations

from typing import Any

from conveyor.fleet.model_load import generative_load
from conveyor.sim.clock import Clock
from conveyor.sim.counted_engine import CountedEngine, CountedStep
from conveyor.sim.counted_pool import GONE, CountedSeq
from conveyor.sim.metrics import Metrics
from conveyor.sim.request import SimRequest
from conveyor.sim.scenario import EngineSpec, Scenario
from conveyor.sim.seat_gate import SeatGate
from conveyor.sim.step_loop import StepLoop
from conveyor.sim.timemodel import LlmStepTime
from conveyor.sim.worker import TRANSPORT_ERROR, Reply


def check_counted(scenario: Scenario) -> None:
    """ValueError when the counted model cannot run ``scenario`` as the exact one would."""
    fleet = scenario.fleet
    if fleet is None or fleet.engine.decode_model != "counted":
        return
    engine = fleet.engine
    problems = []
    if fleet.affinity is not None and fleet.affinity.use_prefix:
        problems.append("prefix-aware routing (it has no prefix cache)")
    if engine.job_tokens_beside_online is not None or any(
        t.kind == "batch_job" for t in scenario.traffic
    ):
        problems.append("batch jobs (online traffic only)")
    if any(t.shared_prefix_tokens or t.kind == "chat" for t in scenario.traffic):
        problems.append("shared prompt prefixes or chat turns (it has no prefix cache)")
    if engine.max_num_seqs > engine.max_num_batched_tokens:
        problems.append("max_num_seqs above max_num_batched_tokens")
    if problems:
        raise ValueError("engine.decode_model counted does not model " + "; ".join(problems))


class CountedLlmWorker(StepLoop):
    """One worker hosting one generative model, its sequences kept as counts."""

    def __init__(
        self, worker_id: str, region: str, clock: Clock, spec: EngineSpec, timing: LlmStepTime,
        kv_tokens: int, metrics: Metrics, *, request_overhead_s: float = 0.0,
    ) -> None:  # fmt: skip
        super().__init__(clock, SeatGate(spec.max_queue, spec.max_num_seqs))
        self.worker_id, self.region = worker_id, region
        self.is_reachable = True
        self.slowdown = 1.0
        self._spec, self._timing, self._metrics = spec, timing, metrics
        self._overhead_s = request_overhead_s
        blocks = max(1, kv_tokens // spec.block_size)
        self.max_model_len = min(spec.max_model_len, blocks * spec.block_size)
        self.engine = CountedEngine(blocks, spec.block_size, spec.max_num_seqs,
                                    spec.max_num_batched_tokens)  # fmt: skip
        self._seqs: dict[int, CountedSeq] = {}
        self._arrival = 0
        self.num_steps = 0

    # -- admission ---------------------------------------------------------------------

    def receive(self, request: SimRequest, reply: Reply) -> None:
        """Admit the attempt or refuse it at once (429), as the generator does."""
        if not self.is_alive:
            reply(request, TRANSPORT_ERROR, 0.0)
            return
        engine = self.engine
        waiting = len(engine.waiting)
        retry_after_s = self.gate.refusal(request, self._clock.now, waiting, waiting)
        if retry_after_s is not None:
            reply(request, 429, retry_after_s)
            return
        prompt = request.num_prompt_tokens
        if prompt + request.output_tokens > self.max_model_len:
            reply(request, 400, 0.0)
            return
        self._arrival += 1
        seq = CountedSeq(request, reply, self._arrival, self._clock.now, prompt, prompt,
                         request.output_tokens, request.deadline_s)  # fmt: skip
        engine.add(seq)
        self._seqs[request.rid] = seq
        self._wake()

    def _retry_after_s(self) -> float:
        return self.gate.retry_after_s(len(self.engine.waiting))

    def abort(self, rid: int) -> None:
        """Free an abandoned request's seat and blocks."""
        seq = self._seqs.pop(rid, None)
        if seq is not None:
            self.engine.remove(seq)

    # -- stepping ----------------------------------------------------------------------

    def _plan_step(self, now: float, epoch: int) -> bool:
        """Plan a step over the counts and time it."""
        engine = self.engine
        if not engine.has_work:
            return False
        step = engine.plan()
        tokens, seqs, kv_tokens = engine.figures(step)
        if seqs == 0:
            return False
        if step.num_preempted:
            self._metrics.add("preemptions", now, step.num_preempted)
        self._metrics.add("batched_tokens", now, tokens)
        step_s = self._timing.step_s(tokens, seqs, kv_tokens)
        self._clock.after(step_s * self.slowdown, self._end_step, step, epoch)
        return True

    def _end_step(self, step: CountedStep, epoch: int) -> None:
        """Apply the step: first tokens and finished requests."""
        if epoch != self._epoch:
            return
        self.num_steps += 1
        now = self._clock.now
        sampled, done = self.engine.end(step)
        for seq in sampled:
            request = seq.request
            if request.first_token_s is None:
                request.first_token_s = now
                self._metrics.add("prompt_tokens", now, seq.num_prompt)
                self._metrics.add("prefix_hit_tokens", now, 0)
        for seq in done:
            self._retire(seq, now)
        self.gate.turnover.on_queue(len(self.engine.waiting))
        self._step(epoch)

    def _retire(self, seq: CountedSeq, now: float) -> None:
        del self._seqs[seq.request.rid]
        self.gate.on_finish(now, seq.admitted_s, len(self.engine.waiting))
        self._metrics.add("output_tokens", now, seq.num_output)
        self._clock.after(self._overhead_s, seq.reply, seq.request, 200, 0.0)

    def _shed_late(self, now: float) -> None:
        """Refuse (429) waiting requests that would get a seat after their deadline."""
        interval_s = self.gate.shed_interval_s(now)
        if interval_s is None:
            return
        for seq in self.engine.waiting.late(now, interval_s):
            self.abort(seq.request.rid)
            self._metrics.add("shed", now)
            seq.reply(seq.request, 429, self._retry_after_s())

    # -- faults and reports ------------------------------------------------------------

    def kill(self) -> list[tuple[SimRequest, Reply]]:
        """Stop stepping; hand back every request in flight."""
        self._stop_stepping()
        lost = [(seq.request, seq.reply) for seq in self._seqs.values() if seq.state != GONE]
        self._seqs.clear()
        return lost

    def load(self) -> dict[str, Any]:
        """As a real worker reports a generative model: waiting plus running as its
        queue depth (no batch-job sequences: online traffic only)."""
        return generative_load(len(self.engine.waiting), self.engine.num_running, 0)

    def sample(self, now_s: float) -> dict[str, float]:
        """Waiting and running sequences, KV use."""
        engine = self.engine
        used = engine.num_blocks - engine.free_blocks
        return {"queue_depth": len(engine.waiting), "running": engine.num_running,
                "kv_use": used / engine.num_blocks}  # fmt: skip
