"""The server protocol's own answers: head limits (431), what is not HTTP (400) and the
connection budget (503, making way), driven by hand as in test_slow_clients."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from conveyor.api.connection_limits import HeadLimits, error_bytes
from conveyor.api.slow_clients import slow_client_protocol
from conveyor.errors import TooManyConnections
from tests.unit.api.protocol_fakes import TIMEOUTS, Server, Transport, apps_done, connect

pytestmark = pytest.mark.anyio

LIMITS = HeadLimits(max_header_bytes=1024, max_headers=10)
GET = b"GET /health HTTP/1.1\r\nHost: t\r\n"


def error_of(transport: Transport) -> dict[str, object]:
    """The OpenAI-shaped error the server wrote, checked to be complete JSON."""
    head, _, body = bytes(transport.written).partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head
    assert b"content-length: %d" % len(body) in head and b"connection: close" in head
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error  # type: ignore[no-any-return]


def test_an_error_response_is_complete_http_with_the_errors_headers() -> None:
    raw = error_bytes(TooManyConnections("busy"))
    assert raw.startswith(b"HTTP/1.1 503 ")
    assert b"retry-after: 1\r\n" in raw and raw.count(b"connection: close") == 1


async def test_a_head_over_the_byte_limit_gets_431_before_it_ends() -> None:
    protocol, _, transport = connect(slow_client_protocol(TIMEOUTS, LIMITS))
    protocol.data_received(GET + b"X-Big: ")
    for _ in range(3):
        protocol.data_received(b"a" * 300)
    assert not transport.written  # 937 bytes so far
    protocol.data_received(b"a" * 300)  # never ends, never runs the app
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert error_of(transport)["code"] == "headers_too_large"
    assert transport.is_eof_written and not protocol.tasks


async def test_one_read_over_the_byte_limit_gets_431() -> None:
    protocol, _, transport = connect(slow_client_protocol(TIMEOUTS, LIMITS))
    protocol.data_received(GET + b"X-Big: " + b"a" * 2000 + b"\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 431 ") and not protocol.tasks


async def test_a_head_within_the_limit_is_served_with_its_body_in_the_same_read() -> None:
    protocol, _, transport = connect(slow_client_protocol(TIMEOUTS, LIMITS))
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n"
    protocol.data_received(head + b"x" * 5000)  # the read is over the limit, the head is not
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 200 ")


async def test_every_request_on_a_connection_has_the_whole_limit() -> None:
    protocol, _, transport = connect(slow_client_protocol(TIMEOUTS, LIMITS))
    request = GET + b"X-Pad: " + b"a" * 700 + b"\r\n\r\n"
    for _ in range(3):
        protocol.data_received(request)
        await apps_done(protocol)
    assert transport.written.count(b"HTTP/1.1 200 ") == 3


async def test_more_fields_than_the_limit_gets_431() -> None:
    protocol, _, transport = connect(slow_client_protocol(TIMEOUTS, LIMITS))
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(10))  # with Host: 11
    protocol.data_received(GET + fields + b"\r\n")
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert "max_headers 10" in str(error_of(transport)["message"])
    assert not protocol.tasks


async def test_what_is_not_http_gets_400_in_openai_shape() -> None:
    protocol, _, transport = connect()
    protocol.data_received(b"NOT HTTP AT ALL\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 400 ")
    assert error_of(transport)["code"] == "invalid_http"
    protocol.data_received(b"more garbage")  # dropped: the parser is not fed again
    assert transport.written.count(b"HTTP/1.1 ") == 1


async def test_a_new_connection_takes_the_place_of_the_longest_waiting() -> None:
    server = Server(slow_client_protocol(TIMEOUTS, max_connections=3))
    (_, idle_transport), (slow, slow_transport), (busy, busy_transport) = (
        server.connect() for _ in range(3)
    )
    slow.data_received(b"POST /v1/emb")  # a head begun, never finished
    busy.data_received(GET + b"\r\n")
    await apps_done(busy)  # answered: waiting again, as the newest
    server.connect()
    assert idle_transport.is_closed and not idle_transport.written  # quietly: nothing begun
    server.connect()
    assert slow_transport.written.startswith(b"HTTP/1.1 503 ")
    assert error_of(slow_transport)["code"] == "too_many_connections"
    assert not busy_transport.is_eof_written and not busy_transport.is_closed


async def wait_forever(scope: Scope, receive: Receive, send: Send) -> None:
    """A request in progress until the test ends."""
    await asyncio.Event().wait()


async def test_a_request_that_finds_every_place_in_progress_gets_503() -> None:
    server = Server(slow_client_protocol(TIMEOUTS, max_connections=2), app=wait_forever)
    running = [server.connect() for _ in range(2)]
    for protocol, _ in running:
        protocol.data_received(GET + b"\r\n")
    late, late_transport = server.connect()  # no one makes way: both are in progress
    late.data_received(GET + b"\r\n")
    await asyncio.sleep(0)  # the refusal runs as the request's app
    await asyncio.sleep(0)
    assert late_transport.written.startswith(b"HTTP/1.1 503 ")
    assert error_of(late_transport)["code"] == "too_many_connections"
    assert all(not transport.written for _, transport in running)
    for protocol, _ in [*running, (late, late_transport)]:
        for task in protocol.tasks:
            task.cancel()


async def test_an_answered_connection_waits_again_and_makes_way() -> None:
    server = Server(slow_client_protocol(TIMEOUTS, max_connections=1))
    first, first_transport = server.connect()
    first.data_received(GET + b"\r\n")
    await apps_done(first)  # answered, kept alive: idle now
    second, second_transport = server.connect()
    assert first_transport.is_closed  # the idle one gave its place up, quietly
    assert first_transport.written.count(b"HTTP/1.1 ") == 1
    second.data_received(GET + b"\r\n")
    await apps_done(second)
    assert second_transport.written.startswith(b"HTTP/1.1 200 ")
