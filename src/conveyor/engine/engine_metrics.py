"""What the engine thread records about each request and the KV cache (vLLM's set, renamed)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.engine_config import EngineStats
from conveyor.engine.core.sequence import Sequence, SequenceStatus
from conveyor.engine.core.step import PrepareTimed, StepExecutor
from conveyor.engine.core.step_plan import SchedulerOutput
from conveyor.engine.request import GenerationRequest
from conveyor.observability.metrics import GeneratorMetrics


class StepPhases:
    """Adds engine-thread seconds to the step phases, in the stats and the metrics."""

    def __init__(self, stats: EngineStats, metrics: GeneratorMetrics) -> None:
        self._totals = stats.step_phase_s
        self._counters = metrics.step_phase_s

    def count(self, phase: str, seconds: float) -> None:
        """Add ``seconds`` to ``phase`` (one of ``observability.metrics.STEP_PHASES``)."""
        self._totals[phase] += seconds
        self._counters[phase].inc(seconds)

    def count_run(self, run_s: float, runner: StepExecutor) -> None:
        """Split a runner's ``execute`` time into preparing inputs and the forward pass."""
        prepare_s = runner.last_prepare_s if isinstance(runner, PrepareTimed) else 0.0
        self.count("prepare", prepare_s)
        self.count("forward", max(0.0, run_s - prepare_s))


def record_admission(
    metrics: GeneratorMetrics, request: GenerationRequest, num_tokens: int, num_cached: int
) -> None:
    """A sequence got KV blocks: its queue time (the first time) and its prefix-cache lookup."""
    if request.num_admissions == 0:
        metrics.queue_time_s.observe(time.monotonic() - request.arrival_s)
    metrics.prefix_cache_query_tokens.inc(num_tokens)
    if num_cached:
        metrics.prefix_cache_hit_tokens.inc(num_cached)


def record_finish(metrics: GeneratorMetrics, request: GenerationRequest) -> None:
    """A request ended normally: its finish reason and its prompt and output lengths."""
    reason = request.finish_reason.value if request.finish_reason else "stop"
    metrics.finished[reason].inc()
    metrics.prompt_length.observe(len(request.prompt_token_ids))
    metrics.generation_length.observe(request.seq.num_output_tokens)


def publish_kv_usage(metrics: GeneratorMetrics, manager: BlockManager) -> None:
    """The KV-cache gauges: blocks used, free, and the used share, set together (a scrape
    never sees one from before a step beside another from after it)."""
    metrics.kv_usage.set(manager.num_used_blocks, manager.num_free_blocks, manager.num_blocks)


def publish_adapters(metrics: GeneratorMetrics, seqs: Iterable[Sequence]) -> None:
    """The LoRA adapters of the running and the waiting sequences (when the model has any)."""
    if metrics.adapters is None:
        return
    running: set[int] = set()
    waiting: set[int] = set()
    for seq in seqs:
        (running if seq.status is SequenceStatus.RUNNING else waiting).add(seq.adapter_id)
    metrics.adapters.publish(running, waiting, time.time())


def note_preemptions(
    stats: EngineStats, metrics: GeneratorMetrics, output: SchedulerOutput
) -> None:
    """Count sequences the scheduler evicted to make room."""
    if output.preempted:
        stats.num_preemptions += len(output.preempted)
        metrics.preemptions.inc(len(output.preempted))


def note_admissions(
    stats: EngineStats,
    metrics: GeneratorMetrics,
    output: SchedulerOutput,
    requests: list[GenerationRequest],
) -> None:
    """Count prefix-cache hits of (re)admitted sequences and split prefills; ``requests``
    are the scheduled sequences' requests, in order."""
    for scheduled, request in zip(output.scheduled, requests, strict=True):
        seq = scheduled.seq
        if request.num_admissions <= seq.num_preemptions:
            record_admission(metrics, request, seq.num_tokens, seq.num_cached_tokens)
            request.num_admissions += 1
            stats.num_prefix_cache_hit_tokens += seq.num_cached_tokens
        if not scheduled.needs_logits:
            stats.num_partial_prefills += 1
