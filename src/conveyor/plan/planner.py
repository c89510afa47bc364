"""Put the arithmetic together: one plan, as a flat dict of named figures (``--json``).

A generative plan comes from a model's shape and a GPU preset (roofline), or from a measured
decode-step curve and prefill time (``--calibrate``). A one-shot plan needs the measured
batch-time curve: a preset cannot say how long an encoder's batch takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from conveyor.plan.curves import LinearCurve
from conveyor.plan.gpus import GpuSpec
from conveyor.plan.shape import ModelShape
from conveyor.plan.sizing import (
    BANDWIDTH_EFFICIENCY,
    Workload,
    batch_for_p99,
    generative_latency_s,
    kv_budget_bytes,
    max_batch_for_kv,
    max_batch_for_tpot,
    one_shot_p99_s,
    output_tokens_per_s,
    prefill_s,
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


def roofline_costs(shape: ModelShape, gpu: GpuSpec, workload: Workload) -> GenerativeCosts:
    """Decode steps bound by bandwidth (at the mean context), prefill by FLOP/s."""
    context = workload.prompt_tokens + workload.output_tokens / 2
    bandwidth = gpu.bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY
    step = LinearCurve(
        shape.weight_bytes / bandwidth, shape.kv_bytes_per_token * context / bandwidth
    )
    prefill = prefill_s(shape.num_params, workload.prompt_tokens, gpu.bf16_flops_per_s)
    return GenerativeCosts(step, prefill, f"preset {gpu.name}")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def plan_generative(
    workload: Workload, costs: GenerativeCosts, shape: ModelShape | None, gpu: GpuSpec | None
) -> Plan:
    """Batch limit, step times, throughput, replicas and cost of a generative model."""
    context = workload.prompt_tokens + workload.output_tokens
    plan: Plan = {"kind": "generative", "source": costs.source}
    ceilings = [] if costs.max_batch is None else [costs.max_batch]
    if shape is not None:
        plan["weight_bytes"] = shape.weight_bytes
        plan["kv_bytes_per_token"] = shape.kv_bytes_per_token
        if gpu is not None:
            budget = kv_budget_bytes(gpu.memory_bytes, shape.weight_bytes)
            plan["kv_budget_bytes"] = budget
            ceilings.append(max_batch_for_kv(budget, shape.kv_bytes_per_token, context))
    if not ceilings:
        raise ValueError("a plan needs a model config and GPU, or a calibration")
    max_batch = min(ceilings)
    if workload.tpot_ms is not None:
        max_batch = max_batch_for_tpot(costs.step, workload.tpot_ms / 1000, max_batch)
    if max_batch < 1:
        raise ValueError("no batch fits: the model does not fit the GPU or the TPOT target")
    tokens_per_s = output_tokens_per_s(max_batch, costs.step, costs.prefill_s,
                                       workload.output_tokens)  # fmt: skip
    rps = tokens_per_s / max(1, workload.output_tokens)
    replicas = replicas_for(workload.qps, rps, workload)
    ttft_s = costs.prefill_s + costs.step.at(max_batch)
    target = workload.p99_ttft_ms
    plan.update({
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
        **_replica_figures(replicas.bare, replicas.with_headroom, replicas.total),
        "usd_per_million_output_tokens": _round(usd_per_million(
            replicas.total, workload.gpu_hour_usd, workload.qps * workload.output_tokens)),
    })  # fmt: skip
    plan.update(_generative_latency(costs, workload, max_batch, replicas.with_headroom))
    return plan


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
        **_replica_figures(replicas.bare, replicas.with_headroom, replicas.total),
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
    figures: Plan = {
        "steady_batch": round(batch, 2),
        "predicted_p99_ms": _ms(one_shot_p99_s(curve, batch, max_wait_s)),
    }
    if workload.p99_ttft_ms is not None:
        knobs = batch_for_p99(curve, workload.p99_ttft_ms / 1000, max_batch)
        figures["recommended_max_batch_size"] = None if knobs is None else knobs[0]
        figures["recommended_max_wait_ms"] = None if knobs is None else _ms(knobs[1])
    return figures


def _replica_figures(bare: int, with_headroom: int, total: int) -> Plan:
    return {"replicas_at_full_load": bare, "replicas_with_headroom": with_headroom,
            "replicas": total}  # fmt: skip


def _round(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 4)
