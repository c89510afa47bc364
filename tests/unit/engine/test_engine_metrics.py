"""vLLM's metric set under Conveyor's names: KV-cache usage, prefix-cache queries and hits,
finish reasons, prompt and generation lengths, queue time, HTTP requests by route and status
(body-validation 400s included) and process metrics, read back from ``/metrics``; and the
figures gateways and autoscalers read under vLLM's own names."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.host.service import Service

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]


@pytest.fixture
async def client(llama_path: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    tiny = {
        "name": "tiny", "kind": "generate", "path": str(llama_path), "kv_cache_tokens": 512,
        "block_size": 4, "max_model_len": 96, "max_num_seqs": 2, "max_num_batched_tokens": 64,
    }  # fmt: skip
    settings = ServerConfig.model_validate({"data_dir": str(tmp_path), "models": [tiny]})
    async with Service(settings) as service:
        transport = httpx.ASGITransport(app=create_app(settings, service=service))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield http


def client_engine(client: httpx.AsyncClient) -> Any:
    """The engine behind ``client``'s app (the ``client`` fixture's model ``tiny``)."""
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    return transport.app.state.service.generators["tiny"].engine  # type: ignore[attr-defined]


async def samples(client: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = (await client.get("/metrics")).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:  # fmt: skip
    return found.get((name, frozenset(labels.items())), 0.0)


def required(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
             **labels: str) -> float:  # fmt: skip
    """The sample's value; a missing sample fails (``value`` would read it as 0)."""
    key = (name, frozenset(labels.items()))
    assert key in found, f"no sample {name}{labels}"
    return found[key]


async def test_generation_and_http_metrics_after_a_few_requests(
    client: httpx.AsyncClient,
) -> None:
    api = openai.AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=client,
                             max_retries=0)  # fmt: skip
    prompt = "the quick brown fox jumps over the lazy dog"
    for _ in range(2):  # the second run finds the prompt's full blocks in the prefix cache
        done = await api.completions.create(model="tiny", prompt=prompt, max_tokens=5)
        assert done.choices[0].finish_reason == "length"
    num_prompt = done.usage.prompt_tokens if done.usage else 0
    bad = await client.post("/v1/completions", json={"model": "tiny", "prompt": 7})
    assert bad.status_code == 400
    # An answer reaches its caller before the engine thread refreshes its gauges: a scrape
    # in between mixed the two (vLLM's KV usage 0, Conveyor's 6/128, in one response).
    assert await asyncio.to_thread(client_engine(client).wait_until_idle, 30)
    found = await samples(client)
    tiny = {"model": "tiny"}
    assert value(found, "conveyor_generation_requests_finished_total", model="tiny",
                 finish_reason="length") == 2  # fmt: skip
    assert value(found, "conveyor_request_prompt_tokens_sum", **tiny) == 2 * num_prompt
    assert value(found, "conveyor_request_generation_tokens_sum", **tiny) == 10
    assert value(found, "conveyor_request_queue_time_seconds_count", **tiny) == 2
    queries = value(found, "conveyor_prefix_cache_query_tokens_total", **tiny)
    hits = value(found, "conveyor_prefix_cache_hit_tokens_total", **tiny)
    assert queries == 2 * num_prompt and 0 < hits < queries
    # The pool is 512 tokens / 4 a block (what a running request holds: the test below).
    used = required(found, "conveyor_kv_blocks_used", **tiny)
    assert used + required(found, "conveyor_kv_blocks_free", **tiny) == 128
    assert required(found, "conveyor_kv_cache_usage_ratio", **tiny) == used / 128
    online = {"model": "tiny", "priority": "online"}
    assert value(found, "conveyor_time_to_first_token_seconds_count", **online) == 2
    assert value(found, "conveyor_request_latency_seconds_count", **online) == 2
    assert value(found, "conveyor_request_latency_seconds_count", model="tiny",
                 priority="batch") == 0  # fmt: skip
    vllm = {"model_name": "tiny", "engine": "0"}
    assert required(found, "vllm:kv_cache_usage_perc", **vllm) == used / 128
    assert required(found, "vllm:gpu_cache_usage_perc", **vllm) == used / 128
    assert required(found, "vllm:num_requests_running", **vllm) == 0
    assert required(found, "vllm:num_requests_waiting", **vllm) == 0
    route = {"method": "POST", "route": "/v1/completions"}
    assert value(found, "conveyor_http_requests_total", **route, status="200") == 2
    assert value(found, "conveyor_http_requests_total", **route, status="400") == 1
    assert value(found, "process_cpu_seconds_total") > 0
    phases = {
        phase: value(found, "conveyor_engine_step_seconds_total", model="tiny", phase=phase)
        for phase in ("schedule", "prepare", "forward", "sample", "postprocess")
    }
    assert all(seconds > 0 for seconds in phases.values()), phases


async def test_kv_usage_shows_the_blocks_a_running_request_holds(
    client: httpx.AsyncClient,
) -> None:
    """While a long request generates, the gauges show the blocks it holds (the client
    transport returns a response only once it is whole, so the metrics are read beside it).

    Every scrape's used + free is the cache's size: the three figures are set together. (As
    three gauges set one by one, a scrape between two sets read the blocks used before a
    step beside the blocks free after it, and failed this test once.)"""
    body = {"model": "tiny", "prompt": "x", "max_tokens": 90, "ignore_eos": True}
    running = asyncio.ensure_future(client.post("/v1/completions", json=body))
    seen: list[tuple[float, float, float]] = []
    vllm_seen: list[tuple[float, float, float]] = []
    vllm = {"model_name": "tiny", "engine": "0"}
    while not running.done():
        found = await samples(client)
        used = required(found, "conveyor_kv_blocks_used", model="tiny")
        if used > 0:
            free = required(found, "conveyor_kv_blocks_free", model="tiny")
            ratio = required(found, "conveyor_kv_cache_usage_ratio", model="tiny")
            seen.append((used, free, ratio))
            vllm_seen.append((ratio, required(found, "vllm:kv_cache_usage_perc", **vllm),
                              required(found, "vllm:num_requests_running", **vllm)))  # fmt: skip
        await asyncio.sleep(0.001)
    assert (await running).status_code == 200
    assert seen, "the request finished before any scrape saw its blocks held"
    assert all(0 < ratio <= 1 for _, _, ratio in seen), seen
    assert all(used + free == 128 and ratio == used / 128 for used, free, ratio in seen), seen
    # vLLM's names read the same gauges, a moment later in the same scrape: the request's
    # blocks only grow, so its share is at least ours unless it has just finished.
    assert all(theirs >= ours or num == 0 for ours, theirs, num in vllm_seen), vllm_seen
    assert any(num == 1 for _, _, num in vllm_seen), vllm_seen


async def test_unmatched_paths_share_one_route_label(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/batches/batch_nope")).status_code in (404, 503)
    assert (await client.get("/no/such/path")).status_code == 404
    found = await samples(client)
    assert value(found, "conveyor_http_requests_total", method="GET", route="unmatched",
                 status="404") == 1  # fmt: skip
    batch_route = [key for key in found if ("route", "/v1/batches/{batch_id}") in key[1]]
    assert batch_route, "the template, not the id, labels the request"
