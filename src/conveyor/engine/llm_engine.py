"""The generation engine: one thread that steps schedule -> run -> sample -> postprocess.

Callers (on an event loop) queue requests and aborts; the engine thread applies them
between steps, so nothing ever changes under a running step. Each step's outputs go back
to the callers' streams in one ``loop.call_soon_threadsafe`` per loop. With nothing to
do, the thread sleeps on a condition variable until a request or an abort arrives.

Out-of-memory in a step halves the scheduler's token budget and plans the step again
(the budget grows back after good steps). Any other failure of the model fails only the
sequences of that step.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable

import torch

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.engine_config import EngineConfig, EngineStats
from conveyor.engine.core.job_share import JobShare
from conveyor.engine.core.prefill_time import PrefillTime
from conveyor.engine.core.prefix_digest import PrefixDigest
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.seat_turnover import SeatTurnover
from conveyor.engine.core.step import ScoresPrompts, StepExecutor
from conveyor.engine.core.step_plan import SchedulerOutput
from conveyor.engine.engine_metrics import (
    StepPhases,
    note_admissions,
    note_preemptions,
    publish_adapters,
    publish_kv_usage,
)
from conveyor.engine.inbox import AbortCommand, AddCommand, Command, Inbox
from conveyor.engine.kv_offload import KVOffload, tier_index
from conveyor.engine.live_requests import Delivery, Entry, LiveRequests
from conveyor.engine.null_metrics import null_generator_metrics
from conveyor.engine.request import GenerationRequest
from conveyor.engine.sampling.grammar import GrammarCompiler
from conveyor.engine.sampling.mask import MaskComputer
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.sampling.sampler import Sampler
from conveyor.engine.stream import GenerationStream, deliver_threadsafe
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.warm_up import prepare_engine_thread
from conveyor.errors import (
    ConveyorError,
    InvalidRequest,
    ModelFault,
    ModelOutOfMemory,
    QueueFull,
    ServiceUnavailable,
)
from conveyor.observability.context import current_request
from conveyor.observability.engine_spans import StepTracer
from conveyor.observability.logs import log_event
from conveyor.observability.metrics import GeneratorMetrics
from conveyor.priority import Priority

__all__ = ["EngineConfig", "EngineStats", "LLMEngine"]

log = logging.getLogger(__name__)

# How often waiting requests are checked against their deadlines (``_shed_late``).
SHED_EVERY_S = 0.025


class LLMEngine:
    """Continuous batching for one model; thread-safe entry points, one stepping thread.

    ``add_request`` / ``abort`` may be called from any thread; outputs are delivered on
    each stream's event loop. Call :meth:`start` once and :meth:`stop` at the end.
    """

    def __init__(
        self,
        runner: StepExecutor,
        tokenizer: Tokenizer,
        config: EngineConfig,
        *,
        metrics: GeneratorMetrics | None = None,
        name: str = "engine",
        kv_offload: KVOffload | None = None,
    ) -> None:
        self.config = config
        self.kv_offload = kv_offload
        self.name = name
        self.stats = EngineStats()
        self._runner = runner
        self._tokenizer = tokenizer
        self._metrics = metrics if metrics is not None else null_generator_metrics()
        self._phases = StepPhases(self.stats, self._metrics)
        self._scheduler = Scheduler(
            config.scheduler_config(),
            BlockManager(config.num_kv_blocks, config.block_size, tier_index(kv_offload)),
            JobShare(config.job_share_config()),
        )
        self._sampler = Sampler()
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.eos_token_ids = frozenset(eos | set(runner.eos_token_ids))
        self.grammars = GrammarCompiler(
            tokenizer, vocab_size=tokenizer.vocab_size, eos_token_ids=self.eos_token_ids
        )
        self.masks = MaskComputer()
        self._next_arrival = 0
        self.prefill_time = PrefillTime()
        self.turnover = SeatTurnover()
        self._live = LiveRequests(self._scheduler, self.stats, self._metrics, self.turnover)
        self._next_shed_s = 0.0
        self._inbox = Inbox(gather_s=config.arrival_window_s, quiet_s=config.arrival_quiet_s)
        self._spans = StepTracer(name)
        self._thread: threading.Thread | None = None
        self.prefix_digest = PrefixDigest()
        self._publish()  # the gauges show the empty pool before the first request

    # -- any thread ---------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests queued or waiting for KV blocks (as of the last step)."""
        return self._inbox.num_waiting

    @property
    def num_running(self) -> int:
        """Sequences holding KV blocks (as of the last step)."""
        return self._inbox.num_running

    @property
    def num_batch(self) -> int:
        """Batch-job sequences waiting or running (as of the last step)."""
        return self._inbox.num_batch

    @property
    def num_used_blocks(self) -> int:
        """KV blocks held by sequences; exact once :meth:`wait_until_idle` returned."""
        return self._scheduler.block_manager.num_used_blocks

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the KV-cache pool."""
        return self._scheduler.block_manager.num_blocks

    @property
    def token_budget(self) -> int:
        """The scheduler's current per-step token budget (lowered after OOM)."""
        return self._scheduler.token_budget

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: Priority = Priority.ONLINE,
        index: int = 0,
        prefix_group: str | None = None,
        adapter_id: int = 0,
        deadline_s: float | None = None,
    ) -> GenerationRequest:
        """Build a request (first token due by ``deadline_s``, monotonic); ValueError if it
        cannot run (too long, empty)."""
        return GenerationRequest(
            request_id=request_id, prompt_token_ids=prompt_token_ids, params=params,
            tokenizer=self._tokenizer, eos_token_ids=self.eos_token_ids,
            max_model_len=self.config.max_model_len, arrival_s=time.monotonic(),
            priority=priority, index=index, prefix_group=prefix_group, adapter_id=adapter_id,
            origin=current_request(), deadline_s=deadline_s,
        )  # fmt: skip

    def add_request(self, request: GenerationRequest, stream: GenerationStream) -> None:
        """Queue ``request``; its outputs go to ``stream``. 503 once the engine stops."""
        if not self._inbox.post(AddCommand(request, stream)):
            raise ServiceUnavailable(f"model {self.name!r} is shutting down")

    def abort(self, request_id: str) -> None:
        """Drop a request between steps and free its blocks; unknown ids are ignored."""
        # Refused once stopping: stopping fails and frees every request anyway.
        self._inbox.post(AbortCommand(request_id))

    def estimated_drain_s(self) -> float:
        """Rough seconds until the requests waiting now have all been admitted."""
        interval_s = self.turnover.mean_interval_s
        if interval_s is not None:  # measured while saturated: seats come free this fast
            return self.num_waiting * interval_s
        seats = self.config.max_num_seqs
        return math.ceil(self.num_waiting / seats) * max(self._live.mean_run_s, 0.1)

    def predicted_online_wait_s(self, num_new: int) -> float | None:
        """Seconds until the last of ``num_new`` online arrivals would get a seat, by the
        measured turnover (None before it is measured)."""
        return self.turnover.predicted_wait_s(self._inbox.num_waiting_online + num_new - 1)

    def wait_until_idle(self, timeout_s: float | None = None) -> bool:
        """Block until no request is queued or unfinished; False on timeout.

        For tests and shutdown: once it returns True every abort has been applied and
        every finished request has released its blocks.
        """
        return self._inbox.wait_until_idle(timeout_s)

    def start(self) -> None:
        """Start the stepping thread; return once it has run its warm-up (``warm_up``), so a
        server reports ready only when its first request meets generated kernels."""
        if self._thread is not None:
            raise RuntimeError(f"engine {self.name!r} is already started")
        prepared = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(prepared,), name=f"engine-{self.name}", daemon=True
        )
        self._thread.start()
        prepared.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop stepping; every unfinished request gets 503."""
        self._inbox.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("engine %s did not stop within %.0f s", self.name, timeout_s)
                return
        self._fail_everything(ServiceUnavailable(f"model {self.name!r} is shutting down"))
        self.masks.close()
        if self.kv_offload is not None:
            self.kv_offload.close()

    # -- engine thread ------------------------------------------------------------

    def _run(self, prepared: threading.Event) -> None:
        """The stepping loop, after the thread's preparation (``prepared`` set then, or
        when it fails: once the engine refuses work, as after a crash)."""
        try:
            prepare_engine_thread(self.config, self._runner)
            prepared.set()
            while (
                commands := self._inbox.take(has_work=self._scheduler.has_unfinished)
            ) is not None:
                started_s = time.perf_counter()
                self._apply(commands)
                self._phases.count("schedule", time.perf_counter() - started_s)
                if self._scheduler.has_unfinished:
                    self._step()
                started_s = time.perf_counter()
                self._publish()
                self._shed_late()
                self._phases.count("postprocess", time.perf_counter() - started_s)
        except Exception:
            log.exception("engine %s crashed", self.name)
            self._inbox.stop()  # refuse new requests from now on
            prepared.set()  # a failed preparation: ``start`` returns to an engine refusing work
            try:
                self._fail_everything(ModelFault("the generation engine crashed"))
            finally:
                self._inbox.mark_idle()

    def _apply(self, commands: Iterable[Command]) -> None:
        """Add and abort requests, in the order callers issued them."""
        for command in commands:
            if isinstance(command, AddCommand):
                self._admit(command.request, command.stream)
            else:
                self._live.abort(command.request_id)

    def _admit(self, request: GenerationRequest, stream: GenerationStream) -> None:
        """Hand a request to the scheduler; a refusal fails only that request."""
        request.seq.arrival = self._next_arrival
        self._next_arrival += 1
        refusal = self.prefill_time.refusal(request.seq, self._scheduler, request.deadline_s)
        if refusal is not None:
            deliver_threadsafe([(stream, refusal)])
            return
        try:
            if request.params.prompt_logprobs is not None and not isinstance(
                self._runner, ScoresPrompts
            ):
                raise ValueError(f"model {self.name!r} cannot return prompt logprobs")
            if request.params.grammar is not None:
                request.matcher = self.grammars.matcher(request.params.grammar)
            self._scheduler.add(request.seq)
        except ValueError as exc:
            deliver_threadsafe([(stream, InvalidRequest(str(exc)))])
            return
        self._live.add(request, stream)
        self._spans.queued(request.request_id, request.origin, request.arrival_s)
        self.stats.num_prompt_tokens += len(request.prompt_token_ids)
        self._metrics.prompt_tokens.inc(len(request.prompt_token_ids))

    def _shed_late(self) -> None:
        """Refuse (429) waiting online requests whose seat, at the measured turnover, would
        come after their first-token deadline: over capacity, said before the deadline
        passes, rather than a 504 at it. Checked at most every ``SHED_EVERY_S``."""
        now_s = time.monotonic()
        interval_s = self.turnover.mean_interval_s
        if interval_s is None or now_s < self._next_shed_s:
            return
        self._next_shed_s = now_s + SHED_EVERY_S
        deliver_threadsafe(self._live.shed_late(now_s, interval_s, self._late_refusal))

    def _late_refusal(self) -> ConveyorError:
        """The 429 of a waiting online request that would get its seat after its deadline."""
        return QueueFull(
            f"model {self.name!r} is over capacity: this request would get a seat only "
            "after its deadline", retry_after_s=max(1, round(self.estimated_drain_s())),
            code="deadline_unreachable",
        )  # fmt: skip

    def _step(self) -> None:
        """Plan, run, sample and account for one step."""
        scheduled_s = time.perf_counter()
        output = self._scheduler.schedule()
        note_preemptions(self.stats, self._metrics, output)
        if output.is_empty:
            # Cannot happen with a pool that fits max_model_len; fail loudly, never spin.
            self._fail_everything(ModelFault("the scheduler could not place any sequence"))
            return
        needs_logits = [self._live[c.seq.seq_id] for c in output.scheduled if c.needs_logits]
        # Requests with max_tokens 0 end at their last prompt token without a sample.
        sampling = [entry for entry in needs_logits if entry.request.max_output_tokens]
        # Started before the forward pass and overlapped with it (llguidance drops the GIL).
        pending = self.masks.start(
            [entry.request.matcher for entry in sampling], self.grammars.vocab_size
        )
        chunks = self._live.chunks(output)
        started_s = time.perf_counter()
        self._phases.count("schedule", started_s - scheduled_s)
        try:
            if self.kv_offload is not None:
                self.kv_offload.flush(self._scheduler.block_manager, self._metrics)
            logits = self._runner.execute(chunks)
        except ModelOutOfMemory as exc:
            self._on_out_of_memory(output, exc)
            return
        except Exception as exc:
            log.exception("engine %s: the model failed a step", self.name)
            self._fail_step(output, ModelFault(f"the model failed on this step: {exc}"))
            return
        finally:
            ran_s = time.perf_counter()
            # Always joined: a matcher must not advance while its mask is being filled.
            allowed = None if pending is None else pending.wait()
        if pending is not None:
            self.stats.grammar_wait_s += pending.wait_s
        self.stats.num_steps += 1
        self._phases.count_run(ran_s - started_s, self._runner)
        self.prefill_time.observe(output.num_batched_tokens, self.token_budget, ran_s - started_s)
        self._live.charge(output, chunks, ran_s - started_s)
        if isinstance(self._runner, ScoresPrompts) and any(c.scoring is not None for c in chunks):
            self._live.keep_prompt_scores(output, chunks, self._runner.last_prompt_scores)
        requests = [self._live[item.seq.seq_id].request for item in output.scheduled]
        note_admissions(self.stats, self._metrics, output, requests)
        if self._spans.num_live:  # some request is traced: its spans go out before its answer
            seq_ids = [scheduled.seq.seq_id for scheduled in output.scheduled]
            self._spans.stepped(seq_ids, output.num_batched_tokens, started_s, self._live)
        self._finish_step(output, needs_logits, logits, allowed, sample_from_s=ran_s)

    def _on_out_of_memory(self, output: SchedulerOutput, exc: ModelOutOfMemory) -> None:
        """Halve the token budget and let the next iteration plan a smaller step."""
        if self._scheduler.token_budget <= 1:
            self._fail_step(output, ModelOutOfMemory(f"out of memory even at one token: {exc}"))
            return
        budget = self._scheduler.shrink_token_budget()
        self.stats.num_oom_retries += 1
        self._metrics.oom_backoffs.inc()
        log_event(
            log, logging.WARNING, "oom_backoff",
            f"engine {self.name} out of memory; token budget now {budget}",
            model=self.name, token_budget=budget,
        )  # fmt: skip

    def _finish_step(
        self,
        output: SchedulerOutput,
        needs_logits: list[Entry],
        logits: torch.Tensor,
        allowed: torch.Tensor | None,
        *,
        sample_from_s: float,
    ) -> None:
        """Sample, advance the scheduler, check stops, hand outputs to the streams.

        ``needs_logits`` are the entries of the rows of ``logits``; those with max_tokens 0
        end here without a sample. The sample phase counts from ``sample_from_s`` (the end
        of the forward pass).
        """
        sampling = [entry for entry in needs_logits if entry.request.max_output_tokens]
        if len(sampling) < len(needs_logits):
            rows = [row for row, e in enumerate(needs_logits) if e.request.max_output_tokens]
            logits = logits[rows]
        result = self._sampler.sample(
            logits,
            [entry.request.params for entry in sampling],
            [entry.request.generator for entry in sampling],
            histories=[entry.request.history() for entry in sampling],
            allowed=allowed,
        )
        sampled_s = time.perf_counter()
        self._phases.count("sample", sampled_s - sample_from_s)
        sampled = {
            entry.request.request_id: token
            for entry, token in zip(sampling, result.token_ids, strict=True)
        }
        ended = [entry for entry in needs_logits if not entry.request.max_output_tokens]
        capped = self._scheduler.postprocess(output, sampled, {e.request.request_id for e in ended})
        now_s = time.monotonic()
        deliveries = [self._live.end_at_length(entry, now_s) for entry in ended]
        self._scheduler.restore_token_budget()
        for row, entry in enumerate(sampling):
            logprobs = result.logprobs[row] if result.logprobs else None
            generated = self._live.take_token(entry, result.token_ids[row], logprobs, now_s)
            deliveries.append((entry.stream, generated))
        for seq in capped:
            if seq.seq_id in self._live:  # at the context length but not finished: end it
                deliveries.append(self._live.end_at_length(self._live[seq.seq_id], now_s))
        deliver_threadsafe(deliveries)
        self._phases.count("postprocess", time.perf_counter() - sampled_s)

    def _fail_step(self, output: SchedulerOutput, error: ConveyorError) -> None:
        """Fail every request scheduled in this step; the others carry on."""
        deliver_threadsafe(self._live.fail_step(output, error))

    def _fail_everything(self, error: ConveyorError) -> None:
        """Fail queued and live requests alike (shutdown, or an engine fault)."""
        adds = [command for command in self._inbox.drain() if isinstance(command, AddCommand)]
        deliveries: list[Delivery] = [(command.stream, error) for command in adds]
        deliveries += self._live.fail_all(error)
        deliver_threadsafe(deliveries)
        self._publish()

    def _publish(self) -> None:
        """Refresh the cross-thread counters and the gauges after a step."""
        scheduler = self._scheduler
        manager = scheduler.block_manager
        stats = self.stats
        stats.max_num_used_blocks = max(stats.max_num_used_blocks, manager.num_used_blocks)
        stats.max_num_running = max(stats.max_num_running, scheduler.num_running)
        self.turnover.on_queue(scheduler.num_waiting)
        metrics = self._metrics
        metrics.running.set(scheduler.num_running)
        metrics.waiting.set(scheduler.num_waiting)
        publish_kv_usage(metrics, manager)
        if self.kv_offload is not None:
            self.kv_offload.publish(metrics)
        publish_adapters(metrics, (request.seq for request in self._live.requests()))
        self.prefix_digest.refresh(manager, force=not scheduler.has_unfinished)
        self._inbox.publish(scheduler)  # last: once idle reads true, the gauges are fresh
