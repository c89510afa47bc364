"""The sizing arithmetic, pure: replicas, batch limits, step times, throughput and cost.

Generative models: weights are read once per decode step and each sequence's KV cache once,
so a step is bound by memory bandwidth; a prefill is bound by FLOPs (2 x params per token).
One-shot models: a batch of n takes ``t(n)`` (measured), and under load a request waits for
the batch in progress, then its own, so its p99 is about ``max(max_wait, t(b)) + t(b)``.
Replicas follow Little's law at a target utilisation, plus what the failure you must survive
takes away (one replica, or one whole region of several).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from conveyor.plan.curves import LinearCurve

# Decode reaches about this share of peak memory bandwidth, prefill of peak FLOP/s
# (serving engines report 60-80 % and 40-60 %); the KV cache may take this share of memory.
BANDWIDTH_EFFICIENCY = 0.7
FLOPS_EFFICIENCY = 0.5
MEMORY_FRACTION = 0.9
# The standard normal's 99th percentile: Poisson counts' p99 is about mean + Z_P99 x sqrt(mean).
Z_P99 = 2.326


@dataclass(frozen=True, slots=True)
class Workload:
    """What the deployment must carry."""

    qps: float
    prompt_tokens: int
    output_tokens: int
    p99_ttft_ms: float | None = None
    tpot_ms: float | None = None
    p99_ms: float | None = None
    gpu_hour_usd: float | None = None
    regions: int = 1
    target_utilisation: float = 0.7

    def __post_init__(self) -> None:
        """Reject loads the arithmetic cannot use."""
        if self.qps <= 0 or self.prompt_tokens < 1 or self.output_tokens < 0:
            raise ValueError("qps must be > 0, prompt tokens >= 1, output tokens >= 0")
        if self.regions < 1 or not 0 < self.target_utilisation <= 1:
            raise ValueError("regions must be >= 1 and target utilisation in (0, 1]")


@dataclass(frozen=True, slots=True)
class Replicas:
    """Replicas at full load, with headroom, and with the failure to survive."""

    bare: int
    with_headroom: int
    total: int
    # With several regions: each region's, so that all but one carry the whole load.
    per_region: int | None = None


def replicas_for(qps: float, per_replica_rps: float, workload: Workload) -> Replicas:
    """Little's law at the target utilisation, then N+1, or a spare region's worth."""
    if per_replica_rps <= 0:
        raise ValueError("a replica must serve a positive rate")
    bare = max(1, math.ceil(qps / per_replica_rps))
    with_headroom = max(1, math.ceil(qps / (per_replica_rps * workload.target_utilisation)))
    if workload.regions == 1:
        return Replicas(bare, with_headroom, with_headroom + 1)
    per_region = math.ceil(with_headroom / (workload.regions - 1))
    return Replicas(bare, with_headroom, per_region * workload.regions, per_region)


def usd_per_million(replicas: int, gpu_hour_usd: float | None, units_per_s: float) -> float | None:
    """Fleet cost per million units (tokens, inputs) at the offered rate."""
    if gpu_hour_usd is None or units_per_s <= 0:
        return None
    return replicas * gpu_hour_usd / (units_per_s * 3600) * 1e6


def decode_step_s(
    weight_bytes: int, kv_bytes_per_token: int, batch: int, context_tokens: float,
    bandwidth_bytes_per_s: float,
) -> float:  # fmt: skip
    """One decode step: the weights once, plus every running sequence's KV cache."""
    moved = weight_bytes + batch * kv_bytes_per_token * context_tokens
    return moved / (bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY)


def prefill_s(num_params: int, prompt_tokens: int, flops_per_s: float) -> float:
    """One prompt's prefill: 2 FLOPs per parameter per token."""
    return 2 * num_params * prompt_tokens / (flops_per_s * FLOPS_EFFICIENCY)


def kv_budget_bytes(memory_bytes: int, weight_bytes: int) -> int:
    """Memory left for the KV cache once the weights are in."""
    return max(0, int(memory_bytes * MEMORY_FRACTION) - weight_bytes)


def max_batch_for_kv(budget_bytes: int, kv_bytes_per_token: int, context_tokens: int) -> int:
    """Sequences whose whole context fits in the KV budget at once."""
    return budget_bytes // (kv_bytes_per_token * max(1, context_tokens))


def max_batch_for_tpot(step: LinearCurve, tpot_s: float, ceiling: int) -> int:
    """The largest batch (<= ``ceiling``) whose decode step meets ``tpot_s``; 0 if none."""
    if step.per_item_s <= 0:
        return ceiling if step.at(1) <= tpot_s else 0
    return max(0, min(ceiling, math.floor((tpot_s - step.fixed_s) / step.per_item_s)))


def output_tokens_per_s(batch: int, step: LinearCurve, prefill: float, output_tokens: int) -> float:
    """Output tokens a replica makes per second with all ``batch`` seats taken.

    A request holds its seat for ``output_tokens`` steps: the one that runs its prefill
    (which yields its first token) and ``output_tokens - 1`` decodes. In the steady state a
    step therefore decodes ``batch (out - 1) / out`` sequences and admits ``batch / out``,
    each admission adding its prefill's marginal cost (``prefill - fixed``) to the step, as
    the latency arithmetic has it; every step yields ``batch`` tokens.
    """
    if batch < 1 or output_tokens < 1:
        return 0.0
    extra = max(0.0, prefill - step.fixed_s)
    admitted = batch / output_tokens
    step_s = step.at(batch - admitted) + admitted * extra
    return batch / max(step_s, 1e-12)


def generative_latency_s(
    step: LinearCurve,
    prefill: float,
    output_tokens: int,
    rate_per_s: float,
    ceiling: int,
    *,
    per_other_s: float = 0.0,
) -> tuple[float, float]:
    """Mean and p99 seconds of a whole request at ``rate_per_s`` (Poisson) on one replica.

    A request takes its own prefill (which yields the first token), then ``output_tokens - 1``
    decode steps beside the ``k`` others running; every request arriving meanwhile slows one
    of those steps by its prefill's marginal cost (``prefill - fixed``). Poisson arrivals see
    the time average, so ``k`` and the arrivals during a request are both ``rate x W``
    (Little's law), solved for the mean ``W`` in closed form. p99: both counts at their
    Poisson 99th percentile (the batch capped at ``ceiling``); each of those others costs
    at least ``per_other_s`` when given (measured: what one other request alongside adds to
    a whole request, its engine steps and the work around them). When that many others
    are more than the seats, the request also waits for seats to free (``seat_wait_s``).
    Infinite when the replica cannot carry the rate, or its seats would all be taken on
    average (requests then queue without bound).
    """
    decode = max(0, output_tokens - 1)
    extra = max(0.0, prefill - step.fixed_s)
    busy = 1.0 - rate_per_s * (decode * step.per_item_s + extra)
    if busy <= 0:
        return math.inf, math.inf
    mean_s = (prefill + decode * step.at(1)) / busy
    others = rate_per_s * mean_s
    if 1 + others > ceiling:
        return mean_s, math.inf
    tail = others + Z_P99 * math.sqrt(others)
    engine = decode * (step.at(min(float(ceiling), 1 + tail)) - step.at(1)) + extra * tail
    p99_s = prefill + decode * step.at(1) + max(engine, per_other_s * tail)
    p99_s += seat_wait_s(1 + tail - ceiling, ceiling, prefill + decode * step.at(ceiling))
    return mean_s, max(mean_s, p99_s)


def seat_wait_s(queued: float, seats: int, seat_s: float) -> float:
    """The wait for a seat behind ``queued`` others when all ``seats`` are taken: a seat
    frees every ``seat_s / seats`` seconds (each is held ``seat_s``)."""
    return max(0.0, queued) * seat_s / seats


def steady_batch(curve: LinearCurve, rate_per_s: float, max_wait_s: float, ceiling: int) -> float:
    """The batch size a one-shot model settles at under ``rate_per_s`` inputs a second.

    A batch collects for ``max(max_wait, t(b))``: b = rate x that, solved for b, in [1, ceiling].
    """
    busy = 1.0 - rate_per_s * curve.per_item_s
    b = rate_per_s * curve.fixed_s / busy if busy > 0 else float(ceiling)
    if curve.at(b) < max_wait_s:
        b = rate_per_s * max_wait_s
    return min(float(ceiling), max(1.0, b))


def one_shot_p99_s(curve: LinearCurve, batch: float, max_wait_s: float) -> float:
    """Waiting for the batch in progress (or the wait window), then running in one's own."""
    return max(max_wait_s, curve.at(batch)) + curve.at(batch)


def batch_for_p99(curve: LinearCurve, p99_s: float, ceiling: int) -> tuple[int, float] | None:
    """The largest batch whose worst case (two batch times) meets ``p99_s``, and a max_wait.

    Waiting longer than one batch time fills no more of it under load, so max_wait is capped
    there. None when even a batch of one cannot meet the target.
    """
    best = max_batch_for_tpot(curve, p99_s / 2, ceiling)
    if best < 1:
        return None
    max_wait_s = max(0.0, min(p99_s - curve.at(best), curve.at(best)))
    return best, max_wait_s
