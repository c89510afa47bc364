"""A gateway's rate limits, applied by its proxy: headers on answers, 429/400 before any
worker is asked, settlement from the worker's usage (whole answers and streams), the
reservation given back when no answer comes.

A scripted worker on 127.0.0.1 (in the test's own event loop) answers with the usage the
test sets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry

from conveyor.gateway.limits import ProxyLimits, StreamMeter, answer_usage
from conveyor.gateway.process import Gateway
from conveyor.observability.metrics import TenantMetrics
from conveyor.tenants.config import TenancyConfig
from conveyor.tenants.gate import RateLimitGate, Reservation
from conveyor.tenants.limiter import MemoryRateLimiter
from tests.unit.gateway.scripted_gateway import gateway_before

pytestmark = pytest.mark.anyio

LIMITS = {"rpm": 3, "input_tpm": 1000, "output_tpm": 100}


@dataclass
class Worker:
    """Answers a chat with `completion_tokens` of usage: a JSON body, or with `stream` an
    event stream of `events` content events (and a usage chunk if `stream_usage`)."""

    completion_tokens: int = 5
    stream: bool = False
    events: int = 3
    stream_usage: bool = True
    hangs_up: bool = False  # closes the connection instead of answering
    num_requests: int = 0
    bodies: list[bytes] = field(default_factory=list)

    def answer(self) -> bytes:
        usage = {"prompt_tokens": 7, "completion_tokens": self.completion_tokens}
        if not self.stream:
            body = orjson.dumps({"object": "chat.completion", "usage": usage})
            return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + (
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
        chunks = [b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'] * self.events
        if self.stream_usage:
            chunks.append(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        chunks.append(b"data: [DONE]\n\n")
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        return head + b"transfer-encoding: chunked\r\n\r\n" + body

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                self.bodies.append(await reader.readexactly(length))
                self.num_requests += 1
                if self.hangs_up:
                    writer.close()
                    return
                writer.write(self.answer())
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Worker, Gateway]]:
    worker = Worker()
    config = {"default_tenant_limits": LIMITS}
    async with gateway_before(worker.handle, tmp_path, config) as (client, gateway):
        yield client, worker, gateway


def chat(max_tokens: int, model: str = "m", stream: bool = False) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream}


async def test_headers_show_the_reservation_and_the_next_answer_the_refund(
    fleet: tuple[httpx.AsyncClient, Worker, Gateway],
) -> None:
    client, _, _ = fleet
    first = await client.post("/v1/chat/completions", json=chat(60))
    second = await client.post("/v1/chat/completions", json=chat(10))
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "3"
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-output-tokens"] == "40"  # 60 reserved
    assert first.headers["x-ratelimit-limit-tokens"] == "100"  # the output bucket is tighter
    # 55 of the 60 came back when the first answer reported 5 completion tokens.
    assert int(second.headers["x-ratelimit-remaining-output-tokens"]) in (85, 86)
    assert second.headers["x-ratelimit-reset-requests"].endswith("s")


async def test_over_the_limit_is_429_and_never_fitting_is_400_before_any_worker(
    fleet: tuple[httpx.AsyncClient, Worker, Gateway],
) -> None:
    client, worker, _ = fleet
    too_big = await client.post("/v1/chat/completions", json=chat(101))
    for _ in range(3):
        assert (await client.post("/v1/chat/completions", json=chat(1))).status_code == 200
    refused = await client.post("/v1/chat/completions", json=chat(1))
    assert too_big.status_code == 400
    assert too_big.json()["error"]["code"] == "tokens_exceed_rate_limit"
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "rpm 3" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "20"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert worker.num_requests == 3


async def test_the_body_reaches_the_worker_as_it_came(
    fleet: tuple[httpx.AsyncClient, Worker, Gateway],
) -> None:
    client, worker, _ = fleet
    body = b'{"model": "m",  "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    answer = await client.post("/v1/chat/completions", content=body)
    assert answer.status_code == 200 and worker.bodies == [body]


async def test_other_routes_and_bad_bodies_pass_unlimited(
    fleet: tuple[httpx.AsyncClient, Worker, Gateway],
) -> None:
    client, _, _ = fleet
    other = await client.post("/v1/files", content=b"{}")
    bad = await client.post("/v1/chat/completions", content=b"not json")
    assert bad.status_code == 400
    assert "x-ratelimit-limit-requests" not in other.headers
    assert "x-ratelimit-limit-requests" not in bad.headers


async def test_a_request_no_worker_answers_gives_its_reservation_back(
    fleet: tuple[httpx.AsyncClient, Worker, Gateway],
) -> None:
    client, worker, _ = fleet
    worker.hangs_up = True
    failed = await client.post("/v1/chat/completions", json=chat(60))
    # The whole output bucket (100): admitted only if the failed request's 60 came back
    # (else 429); then no worker answers either (the one worker is ejected a while).
    whole = await client.post("/v1/chat/completions", json=chat(100))
    assert failed.status_code == 503 and worker.num_requests == 1
    assert whole.status_code == 503, whole.text
    assert whole.headers["x-ratelimit-remaining-output-tokens"] == "0"
    assert whole.headers["x-ratelimit-remaining-requests"] == "1"  # requests stay counted


async def test_a_stream_settles_at_its_usage_chunk_or_else_its_events(
    fleet: tuple[httpx.AsyncClient, Worker, Gateway],
) -> None:
    client, worker, _ = fleet
    worker.stream = True
    with_usage = await client.post("/v1/chat/completions", json=chat(60, stream=True))
    worker.stream_usage, worker.events = False, 8
    without = await client.post("/v1/chat/completions", json=chat(30, stream=True))
    worker.stream = False
    after = await client.post("/v1/chat/completions", json=chat(1))
    assert with_usage.status_code == without.status_code == 200
    assert with_usage.text.endswith("data: [DONE]\n\n")
    # Settled at 5 (the usage chunk) and 7 (eight events, less the first): 100 - 12 - 1.
    assert int(after.headers["x-ratelimit-remaining-output-tokens"]) in (87, 88)


def test_a_whole_answers_usage_is_read_from_its_tail_and_errors_use_nothing() -> None:
    res = Reservation("k", "t", "m", TenancyConfig().limits_for("t", "m"), 9, 60, None)
    body = b'{"padding":"' + b"x" * 5000 + b'","usage":{"prompt_tokens":7,"completion_tokens":5}}'
    assert answer_usage(res, 200, body) == (7, 5)
    assert answer_usage(res, 200, b'{"no":"usage"}') == (9, 60)  # as reserved
    assert answer_usage(res, 500, body) == (0, 0)
    meter = StreamMeter()
    meter.on_message({"type": "http.response.start", "status": 502, "headers": []})
    assert meter.used(res) == (0, 0)


async def test_outside_the_edge_it_fails_loudly_instead_of_dropping_headers() -> None:
    config = TenancyConfig.model_validate({"default_tenant_limits": LIMITS})
    gate = RateLimitGate(config, MemoryRateLimiter(), TenantMetrics(CollectorRegistry()))
    scope = {"path": "/v1/chat/completions", "state": {}}
    with pytest.raises(RuntimeError, match="behind the edge"):
        await ProxyLimits(gate).admit(scope, chat(5))
