"""Put the arithmetic together: one plan, as a flat dict of named figures (``--json``).

A generative plan comes from a model's shape and a GPU preset (roofline), or from a measured
decode-step curve and prefill time (``--calibrate``). A one-shot plan needs the measured
batch-time curve: a preset cannot say how long an encoder's batch takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from conveyor.plan.curves import LinearCurve
from conveyor.plan.gpus import GpuSpec
from conveyor.plan.parallel import TpFit, choice_note, fit_at, sizes_for, tp_prefill_s, tp_step
from conveyor.plan.shape import ModelShape
from conveyor.plan.sizing import (
    Replicas,
    Workload,
    batch_for_p99,
    generative_latency_s,
    max_batch_for_tpot,
    one_shot_p99_s,
    output_tokens_per_s,
    replicas_for,
    steady_batch,
    usd_per_million,
)

Plan = dict[str, Any]


@dataclass(frozen=True, slots=True)
class GenerativeCosts:
    """A generative model's step curve and prefill time, from a preset or measured."""

    step: LinearCurve
    prefill_s: float
    source: str
    max_batch: int | None = None  # a ceiling the measurement could vouch for
    # Measured only: a caller's wait beyond the engine's time, a lone request's tail, and
    # what one other request alongside adds to a caller's time.
    overhead_s: float = 0.0
    tail_s: float = 0.0
    overlap_s: float = 0.0


def roofline_costs(
    shape: ModelShape, gpu: GpuSpec, workload: Workload, tensor_parallel_size: int = 1
) -> GenerativeCosts:
    """Decode steps bound by bandwidth (at the mean context), prefill by FLOP/s, at
    ``tensor_parallel_size`` GPUs a replica (with their all-reduces)."""
    context = workload.prompt_tokens + workload.output_tokens / 2
    step = tp_step(shape, gpu, context, tensor_parallel_size)
    prefill = tp_prefill_s(shape, gpu, workload.prompt_tokens, tensor_parallel_size)
    return GenerativeCosts(step, prefill, f"preset {gpu.name}")


def plan_preset(
    workload: Workload, shape: ModelShape, gpu: GpuSpec, tensor_parallel_size: int | None = None,
    *, ceiling: int | None = None,
) -> Plan:  # fmt: skip
    """The roofline plan at the given tensor-parallel size, or else at the size that needs
    the fewest GPUs in all for the load (the smaller size on a tie); every size tried is in
    the plan, and when none fits the plan says so (``fits`` false).

    ``ceiling`` caps the batch (a served model's ``max_num_seqs``)."""
    tried: list[tuple[TpFit, GenerativeCosts]] = []
    for size in sizes_for(gpu, tensor_parallel_size):
        costs = replace(roofline_costs(shape, gpu, workload, size), max_batch=ceiling)
        tried.append((fit_at(shape, gpu, workload, size, costs.step, ceiling), costs))
    fits = [(fit, costs) for fit, costs in tried if fit.why_not is None]
    fits_only = [fit for fit, _ in tried]
    if not fits:
        fit, costs = tried[-1]
        return plan_generative(workload, costs, shape, gpu, tried=fits_only, chosen=fit,
                               requested=tensor_parallel_size)  # fmt: skip
    plans = [
        plan_generative(
            workload, costs, shape, gpu, tried=fits_only, chosen=fit, requested=tensor_parallel_size
        )
        for fit, costs in fits
    ]
    best = min(plans, key=lambda plan: (plan["gpus"], plan["tensor_parallel_size"]))
    if tensor_parallel_size is None:
        gpus = {plan["tensor_parallel_size"]: plan["gpus"] for plan in plans}
        best["tensor_parallel_note"] = choice_note(
            fits_only, fits[plans.index(best)][0], None, gpus
        )
    return best


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def plan_generative(
    workload: Workload, costs: GenerativeCosts, shape: ModelShape | None, gpu: GpuSpec | None,
    *, tried: list[TpFit] | None = None, chosen: TpFit | None = None,
    requested: int | None = None,
) -> Plan:  # fmt: skip
    """Batch limit, step times, throughput, replicas and cost of a generative model; a
    plan with ``fits`` false (and why) when not even one sequence fits."""
    if workload.output_tokens < 1:
        raise ValueError("a generative model's plan needs --output-tokens >= 1")
    plan: Plan = {"kind": "generative", "source": costs.source}
    if shape is not None:
        plan["weight_bytes"] = shape.weight_bytes
        plan["kv_bytes_per_token"] = shape.kv_bytes_per_token
        if gpu is not None and tried is None:
            tried = [fit_at(shape, gpu, workload, 1, costs.step, costs.max_batch)]
    if tried:
        fit = chosen or tried[-1]
        max_batch, size = fit.max_batch, fit.tensor_parallel_size
        plan.update(_parallel_figures(tried, fit, requested, gpu))
    elif costs.max_batch is not None:
        max_batch, size = _tpot_cap(costs, workload), 1
        plan["fits"] = max_batch >= 1
        if max_batch < 1:
            plan["why_not"] = "even one sequence's decode step misses the TPOT target"
    else:
        raise ValueError("a plan needs a model config and GPU, or a calibration")
    if max_batch < 1:
        return plan
    plan.update(_throughput(workload, costs, max_batch, size))
    plan.update(_generative_latency(costs, workload, max_batch, plan["replicas_with_headroom"]))
    return plan


def _tpot_cap(costs: GenerativeCosts, workload: Workload) -> int:
    """The measured ceiling, lowered to meet the TPOT target."""
    ceiling = costs.max_batch or 0
    if workload.tpot_ms is None:
        return ceiling
    return max_batch_for_tpot(costs.step, workload.tpot_ms / 1000, ceiling)


def _parallel_figures(
    tried: list[TpFit], fit: TpFit, requested: int | None, gpu: GpuSpec | None
) -> Plan:
    """The tensor-parallel size used (``fit``), every size tried with its numbers, and the
    note on the choice."""
    link = None if gpu is None else gpu.link
    figures: Plan = {
        "fits": fit.why_not is None,
        "tensor_parallel_size": fit.tensor_parallel_size,
        "interconnect": None if link is None else link.kind,
        "kv_budget_bytes": fit.kv_budget_bytes_per_gpu,
        "tensor_parallel_note": choice_note(tried, fit, requested),
        "tensor_parallel_tried": [t.as_dict() for t in tried],
    }
    if fit.why_not is not None:
        figures["why_not"] = figures["tensor_parallel_note"]
    return figures


def _throughput(workload: Workload, costs: GenerativeCosts, max_batch: int, size: int) -> Plan:
    """A full replica's tokens and requests per second, replicas, GPUs and cost."""
    tokens_per_s = output_tokens_per_s(max_batch, costs.step, costs.prefill_s,
                                       workload.output_tokens)  # fmt: skip
    rps = tokens_per_s / max(1, workload.output_tokens)
    replicas = replicas_for(workload.qps, rps, workload)
    ttft_s = costs.prefill_s + costs.step.at(max_batch)
    target = workload.p99_ttft_ms
    return {
        "max_batch": max_batch,
        "prefill_ms": _ms(costs.prefill_s),
        "decode_step_ms": _ms(costs.step.at(max_batch)),
        "decode_step_ms_fixed": _ms(costs.step.fixed_s),
        "decode_step_ms_per_seq": _ms(costs.step.per_item_s),
        "predicted_ttft_ms": _ms(ttft_s),
        "meets_p99_ttft": None if target is None else _ms(ttft_s) <= target,
        "tokens_per_s_per_replica": round(tokens_per_s, 3),
        "requests_per_s_per_replica": round(rps, 4),
        # A full replica: every request waits for the others' prefills and their shared steps.
        "predicted_request_ms": _ms(max_batch * max(1, workload.output_tokens) / tokens_per_s),
        **_replica_figures(replicas),
        "gpus_per_replica": size,
        "gpus": replicas.total * size,
        "usd_per_million_output_tokens": _round(usd_per_million(
            replicas.total * size, workload.gpu_hour_usd,
            workload.qps * workload.output_tokens)),
    }  # fmt: skip


def _generative_latency(
    costs: GenerativeCosts, workload: Workload, max_batch: int, replicas: int
) -> Plan:
    """A caller's whole-request mean and p99 at the load each replica carries (with
    headroom): the engine's queueing arithmetic, plus the measured request overhead, plus
    (p99) the measured tail of a lone request."""
    per_replica = workload.qps / replicas
    mean_s, p99_s = generative_latency_s(
        costs.step, costs.prefill_s, max(1, workload.output_tokens), per_replica, max_batch,
        per_other_s=costs.overlap_s,
    )  # fmt: skip
    mean_s += costs.overhead_s
    p99_s += costs.overhead_s + costs.tail_s
    return {
        "per_replica_qps": round(per_replica, 3),
        "request_overhead_ms": _ms(costs.overhead_s),
        "lone_request_tail_ms": _ms(costs.tail_s),
        "overlap_ms": _ms(costs.overlap_s),
        "predicted_mean_ms": None if math.isinf(mean_s) else _ms(mean_s),
        "predicted_p99_ms": None if math.isinf(p99_s) else _ms(p99_s),
    }


def plan_one_shot(
    workload: Workload, curve: LinearCurve, max_batch: int, max_wait_ms: float
) -> Plan:
    """Capacity at full batches, replicas, predicted p99, and the knobs that meet a p99."""
    capacity = max_batch / curve.at(max_batch)
    replicas = replicas_for(workload.qps, capacity, workload)
    per_replica = workload.qps / replicas.with_headroom
    plan: Plan = {
        "kind": "one-shot", "source": "calibrated", "weight_bytes": None,
        "kv_bytes_per_token": None, "max_batch": max_batch,
        "batch_ms_at_max": _ms(curve.at(max_batch)), "batch_ms_fixed": _ms(curve.fixed_s),
        "batch_ms_per_input": _ms(curve.per_item_s),
        "inputs_per_s_per_replica": round(capacity, 3),
        "tokens_per_s_per_replica": round(capacity * workload.prompt_tokens, 3),
        **_replica_figures(replicas),
        "usd_per_million_output_tokens": None,
        "usd_per_million_inputs": _round(
            usd_per_million(replicas.total, workload.gpu_hour_usd, workload.qps)),
        "per_replica_qps": round(per_replica, 3),
    }  # fmt: skip
    plan.update(_one_shot_latency(curve, max_batch, max_wait_ms / 1000, per_replica, workload))
    return plan


def _one_shot_latency(
    curve: LinearCurve, max_batch: int, max_wait_s: float, rate: float, workload: Workload
) -> Plan:
    """Predicted p99 at the current max_wait; recommended knobs for a p99 target."""
    batch = steady_batch(curve, rate, max_wait_s, max_batch)
    # On average a request waits half a window (or half the batch in progress), then its own.
    mean_s = max(max_wait_s, curve.at(batch)) / 2 + curve.at(batch)
    figures: Plan = {
        "steady_batch": round(batch, 2),
        "predicted_mean_ms": _ms(mean_s),
        "predicted_p99_ms": _ms(one_shot_p99_s(curve, batch, max_wait_s)),
    }
    if workload.p99_ttft_ms is not None:
        knobs = batch_for_p99(curve, workload.p99_ttft_ms / 1000, max_batch)
        figures["recommended_max_batch_size"] = None if knobs is None else knobs[0]
        figures["recommended_max_wait_ms"] = None if knobs is None else _ms(knobs[1])
    return figures


def _replica_figures(replicas: Replicas) -> Plan:
    figures: Plan = {
        "replicas_at_full_load": replicas.bare,
        "replicas_with_headroom": replicas.with_headroom,
        "replicas": replicas.total,
    }
    if replicas.per_region is not None:  # --regions 2 or more
        figures["replicas_per_region"] = replicas.per_region
    return figures  # fmt: skip


def _round(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 4)
