"""Request ids on every answer, the per-request log line, and batch-line ids."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.jobs.line_caller import LineCaller, RetryPolicy
from conveyor.jobs.lines import decode_line
from conveyor.observability.context import accept_request_id, current_request
from conveyor.observability.logs import JsonFormatter, TextFormatter, log_event
from conveyor.tenants.usage import Payer

pytestmark = pytest.mark.anyio

SYN = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 2, "max_wait_ms": 1, "dim": 4}


def test_a_callers_id_is_kept_when_acceptable() -> None:
    assert accept_request_id("abc-123:x") == "abc-123:x"
    assert accept_request_id(b"abc") == "abc"


@pytest.mark.parametrize("bad", [None, "", "has space", "line\nbreak", "x" * 201, "é"])
def test_an_unacceptable_id_is_replaced(bad: str | None) -> None:
    fresh = accept_request_id(bad)
    assert fresh != bad and fresh.startswith("req-") and len(fresh) == 36


def _app(**extra: Any) -> Any:
    config = ServerConfig.model_validate({"models": [SYN], "log_format": "json", **extra})
    return create_app(config)


async def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_every_answer_carries_a_request_id(caplog: pytest.LogCaptureFixture) -> None:
    app = _app()
    async with app.router.lifespan_context(app), await _client(app) as client:
        own = await client.post(
            "/v1/embeddings", json={"model": "syn", "input": "hi"},
            headers={"x-request-id": "mine-1"},
        )  # fmt: skip
        fresh = await client.post("/v1/embeddings", json={"model": "syn", "input": "hi"})
        missing = await client.post("/v1/embeddings", json={"model": "nope", "input": "hi"})
        health = await client.get("/health")
    assert own.status_code == 200 and own.headers["x-request-id"] == "mine-1"
    assert fresh.headers["x-request-id"].startswith("req-")
    assert missing.status_code == 404 and missing.headers["x-request-id"].startswith("req-")
    assert health.headers["x-request-id"] != fresh.headers["x-request-id"]


async def test_a_refused_key_still_gets_an_id() -> None:
    app = _app(api_keys=["secret-key-1"])
    async with app.router.lifespan_context(app), await _client(app) as client:
        refused = await client.post("/v1/embeddings", json={"model": "syn", "input": "x"})
    assert refused.status_code == 401 and refused.headers["x-request-id"].startswith("req-")


async def test_one_json_log_line_per_request(caplog: pytest.LogCaptureFixture) -> None:
    app = _app(api_keys=[{"key": "secret-key-1", "tenant": "acme"}])
    caplog.set_level(logging.INFO, logger="conveyor.requests")
    async with app.router.lifespan_context(app), await _client(app) as client:
        answer = await client.post(
            "/v1/embeddings", json={"model": "syn", "input": ["a", "b"]},
            headers={"x-request-id": "r-42", "authorization": "Bearer secret-key-1"},
        )  # fmt: skip
    assert answer.status_code == 200
    records = [r for r in caplog.records if r.name == "conveyor.requests"]
    assert len(records) == 1
    line = orjson.loads(JsonFormatter().format(records[0]))
    assert line["event"] == "request" and line["request_id"] == "r-42"
    assert line["tenant"] == "acme" and line["model"] == "syn" and line["status"] == 200
    assert line["endpoint"] == "/v1/embeddings"
    assert line["batch_size"] in (1, 2) and line["queue_wait_ms"] >= 0
    assert line["model_ms"] >= 2 and line["total_ms"] >= line["model_ms"]


def test_text_format_appends_fields() -> None:
    logger = logging.getLogger("conveyor.test_events")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        log_event(logger, logging.INFO, "worker_joined", "joined", worker_id="w1")
    finally:
        logger.removeHandler(handler)
    text = TextFormatter().format(records[0])
    assert text.endswith("joined [event=worker_joined worker_id=w1]")
    assert orjson.loads(JsonFormatter().format(records[0]))["worker_id"] == "w1"


async def test_a_batch_line_runs_under_its_batch_and_custom_id() -> None:
    seen: list[str | None] = []

    async def run_request(endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
        context = current_request()
        seen.append(context.request_id if context else None)
        return {"ok": True}

    policy = RetryPolicy(0, 0.1, 1.0)
    runner = LineCaller(run_request, "/v1/embeddings", "batch_abc", policy, Payer("t"))
    line = b'{"custom_id": "c-7", "method": "POST", "url": "/v1/embeddings", "body": {}}'
    await runner.run(0, decode_line(line))
    assert seen == ["batch_abc:c-7"]
