"""The proxy's retries, ejection, deadlines and stream passthrough, on a scripted upstream."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson
import pytest
from starlette.responses import StreamingResponse

from conveyor.errors import DeadlineExceeded, ServiceUnavailable
from conveyor.fleet.router import Ejections, Router, WorkerView
from conveyor.fleet.upstream_connection import ConnectFailed, ConnectionBroken, UpstreamTimeout
from conveyor.gateway.forward import (
    OutboundRequest,
    ProxiedResponse,
    Proxy,
    ProxySettings,
    forwardable_headers,
    stream_error_event,
    worker_timeout_ms,
)
from conveyor.observability.metrics import GatewayMetrics

pytestmark = pytest.mark.anyio
M = "m"
NOW = 1000.0


@dataclass
class Sent:
    """One request as the upstream received it."""

    host: str
    method: str
    target: str
    headers: dict[bytes, bytes]
    body: bytes


@dataclass
class Answer:
    """A scripted worker answer; a body part that is an exception is raised there."""

    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    parts: list[bytes | Exception] = field(default_factory=list)
    is_released: bool = False

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    async def read(self) -> bytes:
        try:
            return b"".join([part async for part in self.chunks(1.0)])
        finally:
            self.release()

    async def chunks(self, idle_timeout_s: float) -> AsyncIterator[bytes]:
        for part in self.parts:
            if isinstance(part, Exception):
                raise part
            yield part

    def release(self) -> None:
        self.is_released = True


Handler = Callable[[Sent], Answer]


class ScriptedUpstream:
    """Answers each request with ``handler`` (which may raise an ``UpstreamError``)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sent: list[Sent] = []
        self.answers: list[Answer] = []

    async def request(
        self,
        address: str,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        deadline: float,
    ) -> Answer:
        sent = Sent(urlsplit(address).hostname or "", method, target, dict(headers), body)
        self.sent.append(sent)
        answer = self.handler(sent)
        self.answers.append(answer)
        return answer

    def all_released(self) -> bool:
        return all(answer.is_released for answer in self.answers)


def worker(worker_id: str) -> WorkerView:
    return WorkerView(
        worker_id, f"http://{worker_id}", frozenset({M}), frozenset({M}), last_heartbeat_at=NOW
    )


def make_proxy(
    handler: Handler, workers: list[WorkerView], *, max_attempts: int = 3
) -> tuple[Proxy, Router, ScriptedUpstream]:
    router = Router(random.Random(0), Ejections(cooldown_s=5.0))
    upstream = ScriptedUpstream(handler)
    proxy = Proxy(
        upstream,
        router,
        lambda: workers,
        ProxySettings(max_attempts=max_attempts),
        GatewayMetrics(),
        wall_clock=lambda: NOW,
    )
    return proxy, router, upstream


def outbound(timeout_s: float = 5.0) -> OutboundRequest:
    deadline = asyncio.get_running_loop().time() + timeout_s
    headers = [(b"authorization", b"Bearer k"), (b"content-type", b"application/json")]
    return OutboundRequest("POST", "/v1/embeddings", headers, b'{"model":"m"}', M, deadline)


def ok(sent: Sent) -> Answer:
    body = orjson.dumps({"host": sent.host})
    return Answer(200, [(b"content-type", b"application/json")], [body])


async def whole(response: ProxiedResponse | StreamingResponse) -> ProxiedResponse:
    assert isinstance(response, ProxiedResponse)
    return response


async def test_connection_refused_is_retried_elsewhere_and_ejects() -> None:
    def handler(sent: Sent) -> Answer:
        if sent.host == "a":
            raise ConnectFailed("refused")
        return ok(sent)

    workers = [worker("a"), worker("b")]
    proxy, router, _ = make_proxy(handler, workers)
    for _ in range(10):
        response = await whole(await proxy.forward(outbound()))
        assert response.status_code == 200 and b'"b"' in response.body
    assert router.ejections.is_ejected(workers[0], NOW)
    assert router.in_flight("a") == 0 and router.in_flight("b") == 0


async def test_a_connection_broken_before_the_answer_is_retried_elsewhere() -> None:
    # A worker killed after the request went out: reset or closed before any answer.
    def handler(sent: Sent) -> Answer:
        if sent.host == "a":
            raise ConnectionBroken("the worker closed the connection")
        return ok(sent)

    workers = [worker("a"), worker("b")]
    proxy, router, _ = make_proxy(handler, workers)
    for _ in range(5):
        response = await whole(await proxy.forward(outbound()))
        assert response.status_code == 200 and b'"b"' in response.body
    assert router.ejections.is_ejected(workers[0], NOW)


async def test_a_503_is_retried_without_ejection() -> None:
    def handler(sent: Sent) -> Answer:
        return Answer(503) if sent.host == "a" else ok(sent)

    workers = [worker("a"), worker("b")]
    proxy, router, upstream = make_proxy(handler, workers)
    for _ in range(10):
        assert (await proxy.forward(outbound())).status_code == 200
    assert not router.ejections.is_ejected(workers[0], NOW)
    assert upstream.all_released()


async def test_a_draining_worker_is_out_of_routing_from_its_first_503() -> None:
    def handler(sent: Sent) -> Answer:
        return Answer(503, [(b"x-conveyor-draining", b"1")]) if sent.host == "a" else ok(sent)

    workers = [worker("a"), worker("b"), worker("c")]
    proxy, router, upstream = make_proxy(handler, workers)
    for _ in range(20):
        assert (await proxy.forward(outbound())).status_code == 200
    assert sum(1 for sent in upstream.sent if sent.host == "a") == 1
    assert not router.is_routable(workers[0], NOW) and router.is_routable(workers[1], NOW)
    assert not router.ejections.is_ejected(workers[0], NOW)
    # The same id back after a restart: routable from its first heartbeat after the mark.
    restarted = WorkerView(
        "a", "http://a", frozenset({M}), frozenset({M}), last_heartbeat_at=NOW + 1
    )
    assert router.is_routable(restarted, NOW + 1)
    assert router.is_routable(workers[0], NOW + 1)  # the mark is spent


async def test_drain_marks_of_vanished_workers_are_forgotten() -> None:
    _, router, _ = make_proxy(ok, [worker("a")])
    router.drained.mark("a", NOW)
    router.drained.mark("gone", NOW)
    router.forget_missing({"a"})
    assert not router.is_routable(worker("a"), NOW)
    router.forget_missing(set())
    assert router.is_routable(worker("a"), NOW)


async def test_a_reset_while_reading_the_body_is_retried() -> None:
    def handler(sent: Sent) -> Answer:
        if sent.host == "a":
            return Answer(200, parts=[b'{"par', ConnectionBroken("reset")])
        return ok(sent)

    proxy, _, upstream = make_proxy(handler, [worker("a"), worker("b")])
    for _ in range(5):
        response = await whole(await proxy.forward(outbound()))
        assert response.status_code == 200 and b'"b"' in response.body
    assert upstream.all_released()


async def test_attempts_are_bounded_and_the_error_is_clear() -> None:
    proxy, _, upstream = make_proxy(
        lambda sent: Answer(503), [worker(w) for w in "abcde"], max_attempts=3
    )
    with pytest.raises(ServiceUnavailable, match="no worker could serve model 'm'"):
        await proxy.forward(outbound())
    hosts = [sent.host for sent in upstream.sent]
    assert len(hosts) == 3 and len(set(hosts)) == 3  # three different workers


async def test_no_worker_at_all_is_503() -> None:
    proxy, _, _ = make_proxy(ok, [])
    with pytest.raises(ServiceUnavailable):
        await proxy.forward(outbound())


async def test_a_passed_deadline_is_504_without_sending() -> None:
    proxy, _, upstream = make_proxy(ok, [worker("a")])
    with pytest.raises(DeadlineExceeded):
        await proxy.forward(outbound(timeout_s=-1))
    assert upstream.sent == []


async def test_a_worker_that_does_not_answer_in_time_is_504() -> None:
    def handler(sent: Sent) -> Answer:
        raise UpstreamTimeout("slow")

    proxy, router, _ = make_proxy(handler, [worker("a"), worker("b")])
    with pytest.raises(DeadlineExceeded):
        await proxy.forward(outbound())
    assert router.in_flight("a") == 0 and router.in_flight("b") == 0
    assert not router.ejections.is_ejected(worker("a"), NOW)


async def test_a_body_that_does_not_arrive_in_time_is_504() -> None:
    def handler(sent: Sent) -> Answer:
        return Answer(200, parts=[b"{", UpstreamTimeout("slow")])

    proxy, router, upstream = make_proxy(handler, [worker("a"), worker("b")])
    with pytest.raises(DeadlineExceeded):
        await proxy.forward(outbound())
    assert router.in_flight("a") == 0 and upstream.all_released()


async def test_client_errors_pass_through_with_their_headers() -> None:
    def handler(sent: Sent) -> Answer:
        headers = [(b"content-type", b"application/json"), (b"retry-after", b"3"),
                   (b"content-length", b"12"), (b"server", b"uvicorn")]  # fmt: skip
        return Answer(429, headers, [b'{"error":{}}'])

    proxy, _, _ = make_proxy(handler, [worker("a"), worker("b")])
    response = await whole(await proxy.forward(outbound()))
    assert response.status_code == 429 and response.header(b"retry-after") == b"3"
    assert response.body == b'{"error":{}}'
    assert response.header(b"content-length") is None and response.header(b"server") is None


async def test_a_whole_answer_is_sent_as_it_came_with_its_length() -> None:
    response = await whole(await make_proxy(ok, [worker("a")])[0].forward(outbound()))
    messages: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        messages.append(message)

    await response({"type": "http"}, _no_receive, send)  # type: ignore[arg-type]
    start, body = messages
    assert start["status"] == 200
    assert (b"content-length", b"%d" % len(response.body)) in start["headers"]  # type: ignore[operator]
    assert body == {"type": "http.response.body", "body": b'{"host":"a"}'}


async def _no_receive() -> dict[str, object]:
    raise AssertionError("a whole answer reads nothing from the client")


async def test_the_remaining_deadline_is_forwarded_and_hop_headers_dropped() -> None:
    proxy, _, upstream = make_proxy(ok, [worker("a")])
    await proxy.forward(outbound(timeout_s=2.0))
    (sent,) = upstream.sent
    assert 1000 < float(sent.headers[b"x-conveyor-timeout-ms"]) <= 1950
    assert sent.headers[b"authorization"] == b"Bearer k"
    assert sent.body == b'{"model":"m"}' and sent.target == "/v1/embeddings"
    hops = [
        (b"Host", b"x"),
        (b"connection", b"close"),
        (b"x-conveyor-timeout-ms", b"9"),
        (b"a", b"b"),
    ]
    assert forwardable_headers(hops) == [(b"a", b"b")]


def test_the_worker_is_told_to_finish_before_the_gateway_s_deadline() -> None:
    """The answer must travel back before the gateway's own timer fires: the worker gets the
    time left minus a reserve of at most 50 ms and at most a tenth of it."""
    assert worker_timeout_ms(2.0) == pytest.approx(1950)
    assert worker_timeout_ms(0.1) == pytest.approx(90)
    assert worker_timeout_ms(0.0) == 0


def test_expect_and_the_headers_connection_names_are_not_forwarded() -> None:
    """The gateway holds the whole body before it forwards: a forwarded ``Expect`` would only
    make the worker send an interim ``100`` (which once handed one caller's answer to the
    next caller on that connection), and ``Connection`` names more hop-by-hop headers."""
    hops = [
        (b"Expect", b"100-continue"),
        (b"connection", b"keep-alive, X-Hop, Upgrade"),
        (b"x-hop", b"1"),
        (b"authorization", b"Bearer k"),
    ]
    assert forwardable_headers(hops) == [(b"authorization", b"Bearer k")]


async def _body(response: ProxiedResponse | StreamingResponse) -> bytes:
    assert isinstance(response, StreamingResponse)
    chunks = [c async for c in response.body_iterator]
    return b"".join(
        c if isinstance(c, bytes) else bytes(c) for c in chunks if not isinstance(c, str)
    )


EVENTS = [(b"content-type", b"text/event-stream; charset=utf-8")]


async def test_event_streams_pass_through() -> None:
    events: list[bytes | Exception] = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    proxy, router, upstream = make_proxy(lambda sent: Answer(200, EVENTS, events), [worker("a")])
    response = await proxy.forward(outbound())
    assert router.in_flight("a") == 1  # held until the stream ends
    assert not upstream.all_released()
    assert await _body(response) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert router.in_flight("a") == 0 and upstream.all_released()


async def test_a_stream_that_breaks_ends_with_an_error_event() -> None:
    events: list[bytes | Exception] = [b"data: 1\n\n", ConnectionBroken("peer closed")]
    proxy, router, upstream = make_proxy(lambda sent: Answer(200, EVENTS, events), [worker("a")])
    body = await _body(await proxy.forward(outbound()))
    assert body.startswith(b"data: 1\n\n")
    assert body.endswith(b"\n\n") and b'"code":"worker_failed"' in body
    assert router.in_flight("a") == 0 and upstream.all_released()
    assert stream_error_event("x").startswith(b"data: {")


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        ProxySettings(max_attempts=0)
    with pytest.raises(ValueError):
        ProxySettings(connect_timeout_s=0)
