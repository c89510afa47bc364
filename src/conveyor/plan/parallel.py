"""Tensor parallelism: one replica's weights and KV heads split over N GPUs of a server.

vLLM calls N ``--tensor-parallel-size``. Per GPU: the weights / N, and ``ceil(kv_heads / N)``
KV heads of every token (fewer heads than GPUs are copied). What is left of a GPU's memory
for the KV cache is ``MEMORY_FRACTION`` of it less its weights. A decode step reads every
GPU's share at once, so its memory time shrinks N-fold, but every layer pays two
all-reduces (after attention, after the MLP) of the step's activations (batch x hidden):
each a fixed start-up time plus a ring's ``2 (N - 1) / N`` of the message over the link.
A prefill splits its FLOPs N ways and pays the same all-reduces for the prompt's tokens.

Without ``--tensor-parallel-size`` the planner tries 1, 2, 4, 8 and takes the smallest
that fits (weights in memory, a batch of at least one within the TPOT target); every size
is reported with its numbers (the larger ones leave more room for the KV cache), and when
none fits, that is the plan's answer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from conveyor.plan.curves import LinearCurve
from conveyor.plan.gpus import GpuSpec, Link
from conveyor.plan.shape import ModelShape
from conveyor.plan.sizing import (
    BANDWIDTH_EFFICIENCY,
    FLOPS_EFFICIENCY,
    MEMORY_FRACTION,
    Workload,
    kv_budget_bytes,
    max_batch_for_kv,
    max_batch_for_tpot,
)

TP_SIZES = (1, 2, 4, 8)
# Activations cross the link in bf16.
ACTIVATION_BYTES = 2
ALL_REDUCES_PER_LAYER = 2


def sizes_for(gpu: GpuSpec, requested: int | None) -> tuple[int, ...]:
    """The tensor-parallel sizes to try, smallest first; ValueError for one not allowed."""
    if requested is not None and requested not in TP_SIZES:
        raise ValueError(f"--tensor-parallel-size must be one of {TP_SIZES}, got {requested}")
    if gpu.link is None:
        if requested not in (None, 1):
            raise ValueError(f"preset {gpu.name!r} has no link between devices: one a replica")
        return (1,)
    return TP_SIZES if requested is None else (requested,)


def ring_s(message_bytes: float, size: int, link: Link | None) -> float:
    """A ring all-reduce's transfer time of ``message_bytes`` over ``size`` GPUs (0 for one)."""
    if size == 1 or link is None:
        return 0.0
    return 2 * (size - 1) / size * message_bytes / link.bytes_per_s


def start_up_s(size: int, link: Link | None) -> float:
    """An all-reduce's fixed start-up time (0 for one GPU)."""
    return 0.0 if size == 1 or link is None else link.latency_s


def tp_step(shape: ModelShape, gpu: GpuSpec, context_tokens: float, size: int) -> LinearCurve:
    """A decode step at ``size`` GPUs: each reads its weights and its KV heads of every
    running sequence at once, then every layer's all-reduces of batch x hidden values."""
    bandwidth = gpu.bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY
    reduces = ALL_REDUCES_PER_LAYER * shape.num_layers
    fixed = shape.weight_bytes / size / bandwidth + reduces * start_up_s(size, gpu.link)
    kv = shape.kv_bytes_per_token_per_gpu(size) * context_tokens / bandwidth
    link = reduces * ring_s(shape.hidden_size * ACTIVATION_BYTES, size, gpu.link)
    return LinearCurve(fixed, kv + link)


def tp_prefill_s(shape: ModelShape, gpu: GpuSpec, prompt_tokens: int, size: int) -> float:
    """One prompt's prefill at ``size`` GPUs: 2 FLOPs a parameter a token, split N ways,
    and every layer's all-reduces of prompt x hidden values."""
    flops = 2 * shape.num_params * prompt_tokens / (size * gpu.bf16_flops_per_s * FLOPS_EFFICIENCY)
    message = prompt_tokens * shape.hidden_size * ACTIVATION_BYTES
    reduce_s = start_up_s(size, gpu.link) + ring_s(message, size, gpu.link)
    return flops + ALL_REDUCES_PER_LAYER * shape.num_layers * reduce_s


@dataclass(frozen=True, slots=True)
class TpFit:
    """One tensor-parallel size tried: the figures that decide whether the model fits."""

    tensor_parallel_size: int
    weight_bytes_per_gpu: int
    usable_bytes_per_gpu: int  # MEMORY_FRACTION of the memory: weights and KV cache
    kv_bytes_per_token_per_gpu: int
    kv_budget_bytes_per_gpu: int
    max_batch_for_kv: int
    max_batch: int
    why_not: str | None

    def as_dict(self) -> dict[str, Any]:
        """The figures, JSON-ready."""
        return asdict(self)


def fit_at(
    shape: ModelShape, gpu: GpuSpec, workload: Workload, size: int, step: LinearCurve,
    ceiling: int | None = None,
) -> TpFit:  # fmt: skip
    """Whether the model fits ``size`` GPUs for this workload, and its largest batch."""
    context = workload.prompt_tokens + workload.output_tokens
    weights = math.ceil(shape.weight_bytes / size)
    kv_token = shape.kv_bytes_per_token_per_gpu(size)
    budget = kv_budget_bytes(gpu.memory_bytes, weights)
    for_kv = max_batch_for_kv(budget, kv_token, context)
    batch = for_kv if ceiling is None else min(for_kv, ceiling)
    if workload.tpot_ms is not None:
        batch = max_batch_for_tpot(step, workload.tpot_ms / 1000, batch)
    why = None
    if budget <= 0:
        why = "the weights alone fill the memory"
    elif for_kv < 1:
        why = f"no room for one sequence's KV cache ({context} tokens)"
    elif batch < 1:
        why = f"even one sequence's decode step ({step.at(1) * 1000:.2f} ms) misses the TPOT"
    usable = int(gpu.memory_bytes * MEMORY_FRACTION)
    return TpFit(size, weights, usable, kv_token, budget, for_kv, max(0, batch), why)


def choice_note(
    tried: list[TpFit], chosen: TpFit, requested: int | None,
    gpus_by_size: dict[int, int] | None = None,
) -> str:  # fmt: skip
    """One line on the size used: given; or the one needing the fewest GPUs in all (with
    what the other sizes that fit would need, and why the ones that do not fit do not);
    or, when none fits, why each size tried does not."""
    if chosen.why_not is not None:
        return "nothing fits: " + "; ".join(
            f"{fit.tensor_parallel_size} GPU(s): {fit.why_not}" for fit in tried
        )
    if requested is not None:
        return f"{chosen.tensor_parallel_size} GPU(s) a replica, as given"
    size = chosen.tensor_parallel_size
    note = f"{size} GPU(s) a replica: the fewest GPUs in all for this load"
    if gpus_by_size:
        note += f" ({gpus_by_size[size]:,})"
    counts = gpus_by_size or {}
    others = [
        f"{fit.tensor_parallel_size}: "
        + (fit.why_not or f"{counts.get(fit.tensor_parallel_size, 0):,} GPUs")
        for fit in tried
        if fit.tensor_parallel_size != size
    ]
    return f"{note}; other sizes: {'; '.join(others)}" if others else note
