"""`conveyor plan --calibrate` checked against measurement on this machine.

Each test calibrates a running model, then runs the load the plan predicts for and checks
that throughput and p99 land within 20 % of the plan. Loads last two to four seconds each.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.testing import build_tiny_llama
from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

TOLERANCE = 0.20
LOAD_S = 2.0
# The generative p99 needs more requests than two seconds give (p99 of 80 is the maximum);
# at 40 requests/s, 8 s give about 320, so the p99 is not just the one slowest request.
POISSON_LOAD_S = 8.0
ATTEMPTS = 3
SYN = {"name": "syn", "kind": "synthetic", "max_batch_size": 16, "max_wait_ms": 5,
       "batch_latency_ms": 100, "per_item_ms": 2, "dim": 4, "max_queue": 4096}  # fmt: skip


def run_plan(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    plan: dict[str, Any] = json.loads(result.output)
    return plan


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


Body = Callable[[], dict[str, Any]]


async def closed_loop(url: str, path: str, body: Body, clients: int) -> list[float]:
    """``clients`` callers back to back for LOAD_S; returns each request's latency."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + LOAD_S

    async def caller(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            (await client.post(path, json=body())).raise_for_status()
            latencies.append(time.perf_counter() - started)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        await asyncio.gather(*(caller(client) for _ in range(clients)))
    return latencies


async def open_loop(url: str, path: str, body: Body, rate_per_s: float) -> list[float]:
    """Requests at a steady ``rate_per_s`` for LOAD_S; returns their latencies."""
    latencies: list[float] = []

    async def one(client: httpx.AsyncClient) -> None:
        started = time.perf_counter()
        (await client.post(path, json=body())).raise_for_status()
        latencies.append(time.perf_counter() - started)

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        tasks = []
        start = time.perf_counter()
        for i in range(int(rate_per_s * LOAD_S)):
            await asyncio.sleep(max(0.0, start + i / rate_per_s - time.perf_counter()))
            tasks.append(asyncio.create_task(one(client)))
        await asyncio.gather(*tasks)
    return latencies


async def poisson_loop(url: str, path: str, body: Body, rate_per_s: float) -> list[float]:
    """Requests arriving at random (Poisson, seeded) at ``rate_per_s`` for POISSON_LOAD_S."""
    latencies: list[float] = []
    gaps = random.Random(7)

    async def one(client: httpx.AsyncClient) -> None:
        started = time.perf_counter()
        (await client.post(path, json=body())).raise_for_status()
        latencies.append(time.perf_counter() - started)

    limits = httpx.Limits(max_connections=256)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        tasks = []
        start = due = time.perf_counter()
        while due < start + POISSON_LOAD_S:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(client)))
            due += gaps.expovariate(rate_per_s)
        await asyncio.gather(*tasks)
    return latencies


def within(measured: float, planned: float) -> bool:
    return abs(measured - planned) <= TOLERANCE * planned


def check_with_retries(attempt: Callable[[], list[str]]) -> None:
    """Pass when one of ATTEMPTS calibrate-then-load rounds lands within the tolerance.

    This machine's cores are shared, so a stall elsewhere can spoil one round's p99; a plan
    that is wrong fails every round.
    """
    rounds: list[list[str]] = []
    for _ in range(ATTEMPTS):
        found = attempt()
        if not found:
            return
        rounds.append(found)
    failures = [miss for found in rounds for miss in found]
    pytest.fail("no round landed within 20 % of the plan:\n" + "\n".join(failures))


def test_a_synthetic_model_meets_its_calibrated_plan(
    server_factory: Callable[[dict[str, Any]], Server],
) -> None:
    server = server_factory({"models": [SYN]})

    def body() -> dict[str, Any]:
        return {"model": "syn", "input": "calibrated"}

    def attempt() -> list[str]:
        plan = run_plan("--calibrate", server.url, "--served-model", "syn", "--qps", "60",
                        "--prompt-tokens", "8", "--max-batch", "32", "--max-wait-ms", "5")  # fmt: skip
        assert plan["kind"] == "one-shot" and plan["max_batch"] == 16
        saturated = asyncio.run(closed_loop(server.url, "/v1/embeddings", body, clients=32))
        throughput = len(saturated) / LOAD_S
        rate = plan["per_replica_qps"]
        p99_ms = p99(asyncio.run(open_loop(server.url, "/v1/embeddings", body, rate))) * 1000
        return misses(plan, throughput, "inputs_per_s_per_replica", p99_ms, "predicted_p99_ms")

    check_with_retries(attempt)


def test_a_tiny_llama_meets_its_calibrated_plan(
    server_factory: Callable[[dict[str, Any]], Server], tmp_path: Path
) -> None:
    checkpoint = build_tiny_llama(tmp_path / "tiny-llama")
    model = {"name": "llama", "kind": "generate", "path": str(checkpoint), "device": "cpu",
             "kv_cache_tokens": 4096, "max_num_seqs": 8, "threads": 1}  # fmt: skip
    server = server_factory({"models": [model]})
    rng = random.Random(1)

    def body() -> dict[str, Any]:  # fresh prompts: nothing comes from the prefix cache
        prompt = [rng.randrange(3, 100) for _ in range(16)]
        return {"model": "llama", "prompt": prompt, "max_tokens": 32, "ignore_eos": True,
                "temperature": 0}  # fmt: skip

    def attempt() -> list[str]:
        # 40 requests/s: about half of what a replica carries, so the plan puts one replica
        # at a real utilisation and predicts the whole request's p99 there.
        plan = run_plan("--calibrate", server.url, "--served-model", "llama", "--qps", "40",
                        "--prompt-tokens", "16", "--output-tokens", "32", "--max-batch", "8")  # fmt: skip
        assert plan["kind"] == "generative" and plan["max_batch"] == 8
        latencies = asyncio.run(closed_loop(server.url, "/v1/completions", body, 8))
        tokens_per_s = len(latencies) * 32 / LOAD_S
        rate = plan["per_replica_qps"]
        p99_ms = p99(asyncio.run(poisson_loop(server.url, "/v1/completions", body, rate))) * 1000
        return misses(plan, tokens_per_s, "tokens_per_s_per_replica", p99_ms, "predicted_p99_ms")

    check_with_retries(attempt)


def misses(
    plan: dict[str, Any], rate: float, rate_key: str, p99_ms: float | None, p99_key: str | None
) -> list[str]:
    """What missed the plan by more than the tolerance (nothing: the round passed)."""
    found = []
    if not within(rate, plan[rate_key]):
        found.append(f"throughput {rate:.1f} vs planned {plan[rate_key]}")
    if p99_ms is not None and p99_key is not None and not within(p99_ms, plan[p99_key]):
        found.append(f"p99 {p99_ms:.1f} ms vs planned {plan[p99_key]} ms")
    return found
