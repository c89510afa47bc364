"""A traced completion on a generative model: queue-wait span and engine-step spans.

The app runs in-process with the SDK's in-memory exporter; requests go through the real
middleware (so the server span is the one the engine's spans hang on or link to).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig

pytestmark = [pytest.mark.anyio, pytest.mark.model, pytest.mark.timeout(120)]

MAX_TOKENS = 4


def _app(llama_path: Path, tmp_path: Path, provider: TracerProvider) -> FastAPI:
    model = {"name": "tiny", "kind": "generate", "path": str(llama_path),
             "kv_cache_tokens": 1024, "max_num_seqs": 4}  # fmt: skip
    config = ServerConfig.model_validate({"models": [model], "data_dir": str(tmp_path)})
    return create_app(config, tracer_provider=provider)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def client(
    llama_path: Path, tmp_path: Path, exporter: InMemorySpanExporter
) -> AsyncIterator[httpx.AsyncClient]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = _app(llama_path, tmp_path, provider)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://serve") as http,
    ):
        yield http


async def _complete(
    client: httpx.AsyncClient, request_id: str, max_tokens: int = MAX_TOKENS
) -> None:
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0}  # fmt: skip
    answer = await client.post("/v1/completions", json=body, headers={"x-request-id": request_id})
    assert answer.status_code == 200, answer.text


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def test_a_completion_gets_a_queue_wait_span_and_linked_step_spans(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    await _complete(client, "gen-1")
    spans = exporter.get_finished_spans()
    (server,) = _named(spans, "POST /v1/completions")
    (queue,) = _named(spans, "conveyor.queue_wait")
    steps = _named(spans, "conveyor.engine_step")
    assert queue.parent is not None and queue.parent.span_id == server.context.span_id
    assert queue.context.trace_id == server.context.trace_id
    # One prefill step yields the first token, then one decode step per further token.
    assert len(steps) == MAX_TOKENS
    for step in steps:
        assert step.parent is None
        assert [link.context.span_id for link in step.links] == [server.context.span_id]
        assert step.attributes is not None
        assert step.attributes["conveyor.request_ids"] == ("gen-1",)
        assert step.attributes["conveyor.model"] == "tiny"
    assert queue.end_time is not None and steps[0].start_time is not None
    assert queue.end_time <= min(s.start_time or 0 for s in steps)
    assert steps[0].attributes is not None and steps[0].attributes["conveyor.step.num_tokens"] == 4


async def test_a_step_serving_two_requests_links_both(
    client: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    # Long enough answers that the second request reaches the engine while the first still
    # decodes, even on a loaded machine (4 tokens each sometimes ran one after the other).
    await asyncio.gather(*(_complete(client, f"gen-{n}", max_tokens=64) for n in "ab"))
    spans = exporter.get_finished_spans()
    servers = {
        s.attributes["conveyor.request_id"]: s.context.span_id
        for s in _named(spans, "POST /v1/completions")
        if s.attributes is not None
    }
    assert len(_named(spans, "conveyor.queue_wait")) == 2
    linked = [
        {link.context.span_id for link in s.links} for s in _named(spans, "conveyor.engine_step")
    ]
    assert set(servers.values()) in linked  # some step ran both
    assert all(ids <= set(servers.values()) for ids in linked)


async def test_untraced_requests_leave_the_engine_nothing_to_trace(
    llama_path: Path, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)  # tracing on, this request not sampled
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = _app(llama_path, tmp_path, provider)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as http,
    ):
        await _complete(http, "quiet")
        engine = app.state.service.generators["tiny"].engine
        assert engine._spans.num_live == 0
    assert exporter.get_finished_spans() == ()
