"""The proxy's retries, ejection, deadlines and stream passthrough, on httpx mock transports."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from starlette.responses import Response, StreamingResponse

from conveyor.errors import DeadlineExceeded, ServiceUnavailable
from conveyor.fleet.proxy import (
    OutboundRequest,
    Proxy,
    ProxySettings,
    forwardable_headers,
    stream_error_event,
)
from conveyor.fleet.router import Ejections, Router, WorkerView
from conveyor.metrics import GatewayMetrics

pytestmark = pytest.mark.anyio
M = "m"
NOW = 1000.0

Handler = Callable[[httpx.Request], httpx.Response]


def worker(worker_id: str) -> WorkerView:
    return WorkerView(
        worker_id, f"http://{worker_id}", frozenset({M}), frozenset({M}), last_heartbeat_at=NOW
    )


def make_proxy(
    handler: Handler, workers: list[WorkerView], *, max_attempts: int = 3
) -> tuple[Proxy, Router]:
    router = Router(random.Random(0), Ejections(cooldown_s=5.0))
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    proxy = Proxy(
        client,
        router,
        lambda: workers,
        ProxySettings(max_attempts=max_attempts),
        GatewayMetrics(),
        wall_clock=lambda: NOW,
    )
    return proxy, router


def outbound(timeout_s: float = 5.0) -> OutboundRequest:
    deadline = asyncio.get_running_loop().time() + timeout_s
    headers = [("authorization", "Bearer k"), ("content-type", "application/json")]
    return OutboundRequest("POST", "/v1/embeddings", headers, b'{"model":"m"}', M, deadline)


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"host": request.url.host})


async def test_connection_refused_is_retried_elsewhere_and_ejects() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            raise httpx.ConnectError("refused", request=request)
        return ok(request)

    workers = [worker("a"), worker("b")]
    proxy, router = make_proxy(handler, workers)
    for _ in range(10):
        response = await proxy.forward(outbound())
        assert response.status_code == 200 and b'"b"' in response.body
    assert router.ejections.is_ejected(workers[0], NOW)
    assert router.in_flight("a") == 0 and router.in_flight("b") == 0


async def test_a_client_stack_crash_on_a_closed_socket_is_retried_elsewhere() -> None:
    # Regression: a worker killed mid-request once made httpcore raise AttributeError
    # ('NoneType' object has no attribute 'getpeername'), which became a 500.
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            raise AttributeError("'NoneType' object has no attribute 'getpeername'")
        return ok(request)

    workers = [worker("a"), worker("b")]
    proxy, router = make_proxy(handler, workers)
    for _ in range(5):
        response = await proxy.forward(outbound())
        assert response.status_code == 200 and b'"b"' in response.body
    assert router.ejections.is_ejected(workers[0], NOW)


async def test_a_503_is_retried_without_ejection() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503) if request.url.host == "a" else ok(request)

    workers = [worker("a"), worker("b")]
    proxy, router = make_proxy(handler, workers)
    for _ in range(10):
        assert (await proxy.forward(outbound())).status_code == 200
    assert not router.ejections.is_ejected(workers[0], NOW)


async def test_a_reset_while_reading_the_body_is_retried() -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b'{"par'
            raise httpx.ReadError("reset")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            return httpx.Response(200, stream=Broken())
        return ok(request)

    proxy, _ = make_proxy(handler, [worker("a"), worker("b")])
    for _ in range(5):
        response = await proxy.forward(outbound())
        assert response.status_code == 200 and b'"b"' in response.body


async def test_attempts_are_bounded_and_the_error_is_clear() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        return httpx.Response(503)

    proxy, _ = make_proxy(handler, [worker(w) for w in "abcde"], max_attempts=3)
    with pytest.raises(ServiceUnavailable, match="no worker could serve model 'm'"):
        await proxy.forward(outbound())
    assert len(calls) == 3 and len(set(calls)) == 3  # three different workers


async def test_no_worker_at_all_is_503() -> None:
    proxy, _ = make_proxy(ok, [])
    with pytest.raises(ServiceUnavailable):
        await proxy.forward(outbound())


async def test_a_passed_deadline_is_504_without_sending() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        return ok(request)

    proxy, _ = make_proxy(handler, [worker("a")])
    with pytest.raises(DeadlineExceeded):
        await proxy.forward(outbound(timeout_s=-1))
    assert calls == []


async def test_a_worker_that_does_not_answer_in_time_is_504() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    proxy, router = make_proxy(handler, [worker("a"), worker("b")])
    with pytest.raises(DeadlineExceeded):
        await proxy.forward(outbound())
    assert router.in_flight("a") == 0 and router.in_flight("b") == 0


async def test_client_errors_pass_through_with_their_headers() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"error": {}}, headers={"retry-after": "3"})

    proxy, _ = make_proxy(handler, [worker("a"), worker("b")])
    response = await proxy.forward(outbound())
    assert response.status_code == 429 and response.headers["retry-after"] == "3"


async def test_the_remaining_deadline_is_forwarded_and_hop_headers_dropped() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return ok(request)

    proxy, _ = make_proxy(handler, [worker("a")])
    await proxy.forward(outbound(timeout_s=2.0))
    (request,) = seen
    assert 1000 < float(request.headers["x-conveyor-timeout-ms"]) <= 2000
    assert request.headers["authorization"] == "Bearer k"
    assert forwardable_headers([("Host", "x"), ("Connection", "close"), ("a", "b")]) == [("a", "b")]


async def _body(response: Response) -> bytes:
    assert isinstance(response, StreamingResponse)
    chunks = [c async for c in response.body_iterator]
    return b"".join(
        c if isinstance(c, bytes) else bytes(c) for c in chunks if not isinstance(c, str)
    )


async def test_event_streams_pass_through() -> None:
    class Events(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for event in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
                yield event

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Events())

    proxy, router = make_proxy(handler, [worker("a")])
    response = await proxy.forward(outbound())
    assert router.in_flight("a") == 1  # held until the stream ends
    assert await _body(response) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert router.in_flight("a") == 0


async def test_a_stream_that_breaks_ends_with_an_error_event() -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"data: 1\n\n"
            raise httpx.RemoteProtocolError("peer closed")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    proxy, router = make_proxy(handler, [worker("a")])
    body = await _body(await proxy.forward(outbound()))
    assert body.startswith(b"data: 1\n\n")
    assert body.endswith(b"\n\n") and b'"code":"worker_failed"' in body
    assert router.in_flight("a") == 0
    assert stream_error_event("x").startswith(b"data: {")


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        ProxySettings(max_attempts=0)
    with pytest.raises(ValueError):
        ProxySettings(connect_timeout_s=0)
