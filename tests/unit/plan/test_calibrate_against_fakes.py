"""A calibrated plan against the model it measured, in virtual time: deterministic.

The fakes keep exactly to the rules the arithmetic assumes (``fake_servers``), with costs
like those ``bench.plan_accuracy`` calibrates on this project's synthetic model and tiny
Llama. Each round calibrates the fake as ``conveyor plan --calibrate`` would, plans, then
measures it under the load the plan speaks of: throughput with every seat taken (closed
loop), p99 at the plan's per-replica rate. Both must land within 20 % of the plan in every
round. This checks the arithmetic; how well it holds on a real server, whose host adds its
own noise, is the benchmark's question (its smoke run is in the integration tests).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from conveyor.plan.calibrate import (
    GenerativeCalibration,
    calibrate_generative,
    calibrate_one_shot,
)
from conveyor.plan.compose import PlanRequest, capacity_plan
from conveyor.plan.curves import LinearCurve
from conveyor.plan.pace import Pace
from tests.unit.plan.fake_servers import FakeBatcher, FakeEngine
from tests.virtual_time import run_virtual

ROUNDS = range(5)
TOLERANCE = 0.20
Call = Callable[[], Awaitable[None]]


def _now() -> float:
    return asyncio.get_running_loop().time()


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def closed_loop(call: Call, callers: int, seconds: float) -> int:
    """``callers`` back to back for ``seconds``; requests finished."""
    stop_at, done = _now() + seconds, 0

    async def caller() -> None:
        nonlocal done
        while _now() < stop_at:
            await call()
            done += 1

    await asyncio.gather(*(caller() for _ in range(callers)))
    return done


async def arrivals(call: Call, gap: Callable[[], float], seconds: float) -> list[float]:
    """Requests ``gap()`` apart for ``seconds``; each one's latency."""
    latencies: list[float] = []

    async def one() -> None:
        started = _now()
        await call()
        latencies.append(_now() - started)

    tasks, end_at, due = [], _now() + seconds, _now()
    while due < end_at:
        await asyncio.sleep(max(0.0, due - _now()))
        tasks.append(asyncio.ensure_future(one()))
        due += gap()
    await asyncio.gather(*tasks)
    return latencies


def within(planned: float, measured: float) -> bool:
    return abs(measured / planned - 1) <= TOLERANCE


async def llama_round(seed: int) -> dict[str, Any]:
    engine = FakeEngine(LinearCurve(0.0023, 0.0002), prefill_s=0.0035, max_batch=8)
    measured = await calibrate_generative(engine, 16, 32, 8, Pace(600))
    plan = capacity_plan(PlanRequest(prompt_tokens=16, output_tokens=32, qps=40), measured, 40)
    done = await closed_loop(lambda: engine.complete(16, 32), 8, 10.0)
    rate, rng = plan["per_replica_qps"], random.Random(seed)
    latencies = await arrivals(lambda: engine.complete(16, 32), lambda: rng.expovariate(rate),
                               max(120.0, 3000 / rate))  # fmt: skip
    return {"plan": plan, "throughput": done * 32 / 10.0, "p99_ms": p99(latencies) * 1000}


async def synthetic_round(seed: int) -> dict[str, Any]:
    batcher = FakeBatcher(LinearCurve(0.100, 0.002), max_batch=16, max_wait_s=0.005)
    measured = await calibrate_one_shot(batcher, 8, 32, Pace(600))
    request = PlanRequest(prompt_tokens=8, qps=60, max_wait_ms=5)
    plan = capacity_plan(request, measured, 60)
    done = await closed_loop(lambda: batcher.embed(1, 8), 32, 10.0)
    rate = plan["per_replica_qps"]
    jitter = random.Random(seed)  # steady arrivals, each nudged by up to a millisecond
    latencies = await arrivals(lambda: batcher.embed(1, 8),
                               lambda: 1 / rate + jitter.uniform(-1e-3, 1e-3), 60.0)  # fmt: skip
    return {"plan": plan, "throughput": done / 10.0, "p99_ms": p99(latencies) * 1000}


@pytest.mark.parametrize("seed", ROUNDS)
def test_the_tiny_llamas_calibrated_plan_holds_on_the_engine_it_measured(seed: int) -> None:
    result = run_virtual(llama_round(seed))
    plan = result["plan"]
    assert plan["source"] == "calibrated" and plan["max_batch"] == 8
    assert within(plan["tokens_per_s_per_replica"], result["throughput"]), result
    assert within(plan["predicted_p99_ms"], result["p99_ms"]), result


@pytest.mark.parametrize("seed", ROUNDS)
def test_the_synthetic_models_calibrated_plan_holds_on_the_batcher_it_measured(
    seed: int,
) -> None:
    result = run_virtual(synthetic_round(seed))
    plan = result["plan"]
    assert plan["kind"] == "one-shot" and plan["max_batch"] == 16
    assert within(plan["inputs_per_s_per_replica"], result["throughput"]), result
    assert within(plan["predicted_p99_ms"], result["p99_ms"]), result


def test_calibration_on_the_fake_engine_recovers_its_costs_exactly() -> None:
    async def calibrated() -> GenerativeCalibration:
        engine = FakeEngine(LinearCurve(0.0023, 0.0002), prefill_s=0.0035, max_batch=8)
        return await calibrate_generative(engine, 16, 32, 8, Pace(600))

    measured = run_virtual(calibrated())
    assert measured.step.fixed_s == pytest.approx(0.0023)
    assert measured.step.per_item_s == pytest.approx(0.0002)
    assert measured.prefill_s == pytest.approx(0.0035)
    assert measured.overhead_s == pytest.approx(0.0, abs=1e-9)
    assert measured.tail_s == pytest.approx(0.0, abs=1e-9)
