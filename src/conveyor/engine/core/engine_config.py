"""The engine's limits (scheduler limits plus the KV pool's shape) and its counters.

Torch-free, so callers can size and describe an engine without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.engine.core.job_share import JobShareConfig
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.step import SeqChunk
from conveyor.observability.metrics import STEP_PHASES


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """Limits of one engine: scheduler limits plus the KV-cache pool's shape."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    # Batch-job tokens a step while online traffic is present (None: no cap).
    job_tokens_beside_online: int | None = None
    # Distinct LoRA adapters per step (the device-resident slots); None: no adapters.
    max_loras_per_batch: int | None = None
    # Intra-op threads of the engine thread (None: torch's default, or one per pinned core).
    threads: int | None = None
    # CPU cores the engine thread and its OpenMP threads run on (None: not pinned).
    cpu_cores: tuple[int, ...] | None = None
    # Woken from idle by a request, how long the engine waits for the rest of its burst,
    # and the gap without arrivals that ends the wait early (None: no early end).
    arrival_window_s: float = 0.0
    arrival_quiet_s: float | None = None
    # The engine thread's first step, before any request (see ``engine.warm_up``).
    warm_up_chunks: tuple[SeqChunk, ...] = ()
    # Then, where the runner pads steps to row buckets, their kernels for steps of up to
    # this many rows (0: none; see ``step.WarmsRowBuckets``).
    warm_up_rows: int = 0

    def job_share_config(self) -> JobShareConfig:
        """The cap on batch-job tokens beside online traffic (validated there)."""
        return JobShareConfig(self.job_tokens_beside_online)

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's share of the limits (validated there)."""
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            max_loras_per_batch=self.max_loras_per_batch,
        )


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine started; written by the engine thread only."""

    num_steps: int = 0
    num_preemptions: int = 0
    num_prefix_cache_hit_tokens: int = 0
    # Prefill chunks that stopped short of the sequence's end (chunked prefill).
    num_partial_prefills: int = 0
    num_oom_retries: int = 0
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_failed: int = 0
    max_num_used_blocks: int = 0
    max_num_running: int = 0
    # Seconds the engine thread waited for grammar masks after the forward pass.
    grammar_wait_s: float = 0.0
    # Engine-thread seconds per phase of a step: schedule (plan the step, start grammar
    # masks), prepare (pack the step's inputs onto the device), forward (the model),
    # sample (wait for masks, sample), postprocess (advance sequences, detokenize, deliver).
    step_phase_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_PHASES, 0.0))
