"""One request through a gateway and a worker yields one connected trace.

Both run in this process and share one in-memory span exporter: the worker is a real
uvicorn server on a loopback port (the gateway reaches it over HTTP, so ``traceparent``
really travels in a header), the gateway is called in-process.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conveyor.api.app import create_app
from conveyor.api.gateway_app import create_gateway_app
from conveyor.config.settings import ServerConfig
from conveyor.gateway.process import GatewaySettings
from conveyor.stores import open_job_store
from tests.polling import until_async

pytestmark = pytest.mark.anyio

SYN = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 5, "max_wait_ms": 1, "dim": 4}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
async def worker_url(provider: TracerProvider, tmp_path: Path) -> AsyncIterator[str]:
    config = ServerConfig.model_validate({"models": [SYN], "data_dir": str(tmp_path / "w")})
    app = create_app(config, tracer_provider=provider)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())

    def started() -> bool:
        assert not serving.done(), "the worker stopped before it started"
        return bool(server.started)

    await until_async(started, "the worker to start", timeout_s=20, interval_s=0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await serving


async def _through_gateway(
    provider: TracerProvider, tmp_path: Path, worker_url: str, headers: dict[str, str]
) -> httpx.Response:
    store_url = f"sqlite://{tmp_path}/jobs.sqlite"
    store = open_job_store(store_url)
    store.upsert_worker("w1", worker_url, ["syn"], 32, {"models": {}}, time.time())
    config = ServerConfig.model_validate({"models": [SYN], "data_dir": str(tmp_path / "g")})
    settings = GatewaySettings(store_url=store_url, stale_after_s=60)
    app = create_gateway_app(settings, config, store=store, tracer_provider=provider)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        return await client.post(
            "/v1/embeddings", json={"model": "syn", "input": "hello"}, headers=headers
        )


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def test_one_request_makes_one_connected_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path, worker_url: str
) -> None:
    answer = await _through_gateway(provider, tmp_path, worker_url, {"x-request-id": "trace-1"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == "trace-1"
    spans = exporter.get_finished_spans()
    server_spans = _by_name(spans, "POST /v1/embeddings")
    assert len(server_spans) == 2  # the gateway's and the worker's
    (route,) = _by_name(spans, "conveyor.gateway.route")
    (attempt,) = _by_name(spans, "conveyor.gateway.attempt")
    (queue,) = _by_name(spans, "conveyor.queue_wait")
    (batch,) = _by_name(spans, "conveyor.model_batch")
    gateway_span = next(s for s in server_spans if s.parent is None)
    worker_span = next(s for s in server_spans if s.parent is not None)
    trace_id = gateway_span.context.trace_id
    chain = [gateway_span, route, attempt, worker_span, queue]
    assert all(span.context.trace_id == trace_id for span in chain)
    for parent, child in itertools.pairwise(chain):
        assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert [link.context.span_id for link in batch.links] == [worker_span.context.span_id]
    assert batch.attributes is not None and batch.attributes["conveyor.request_ids"] == ("trace-1",)
    assert worker_span.attributes is not None
    assert worker_span.attributes["conveyor.request_id"] == "trace-1"


async def test_a_callers_traceparent_is_continued(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path, worker_url: str
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = f"00-{trace_id}-00f067aa0ba902b7-01"
    answer = await _through_gateway(provider, tmp_path, worker_url, {"traceparent": parent})
    assert answer.status_code == 200
    traced = [s for s in exporter.get_finished_spans() if s.name != "conveyor.model_batch"]
    assert traced and {format(s.context.trace_id, "032x") for s in traced} == {trace_id}
