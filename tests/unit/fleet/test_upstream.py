"""The gateway's pooled HTTP/1.1 client against a scripted server on 127.0.0.1.

The server runs in the test's own event loop and answers exactly as each test scripts it,
so every outcome (reuse, chunking, resets, silence) is decided by the script, not by timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from conveyor.fleet import upstream_connection as connection_module
from conveyor.fleet.upstream import PoolLimits, UpstreamPool
from conveyor.fleet.upstream_connection import (
    ConnectFailed,
    ConnectionBroken,
    UpstreamTimeout,
    encode_head,
    parse_origin,
)

pytestmark = pytest.mark.anyio

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class ScriptedServer:
    """Accepts connections and runs ``script`` on each; counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.num_connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """One whole request (head and Content-Length body)."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[ScriptedServer]]]:
    servers: list[ScriptedServer] = []

    async def start(script: Script) -> ScriptedServer:
        server = ScriptedServer(script)
        server.server = await asyncio.start_server(server._handle, "127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()


def deadline(seconds: float = 5.0) -> float:
    return asyncio.get_running_loop().time() + seconds


async def post(
    pool: UpstreamPool, address: str, body: bytes = b'{"model":"m"}', **kw: float
) -> bytes:
    answer = await pool.request(
        address, "POST", "/v1/embeddings?x=1", [(b"authorization", b"Bearer k")], body,
        kw.get("deadline", deadline()),
    )  # fmt: skip
    assert answer.status == 200
    return await answer.read()


async def test_requests_reuse_one_keep_alive_connection(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            writer.write(OK)

    server = await serve(script)
    pool = UpstreamPool()
    for _ in range(3):
        assert await post(pool, server.address) == b"{}"
    assert server.num_connections == 1 and pool.num_idle(server.address) == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/embeddings?x=1 HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"content-length: 13\r\n" in first and b"authorization: Bearer k\r\n" in first
    assert first.endswith(b'\r\n\r\n{"model":"m"}')
    pool.close()


async def test_a_chunked_stream_arrives_piece_by_piece(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    second_may_go = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"
        )
        await second_may_go.wait()
        writer.write(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        await reader.read()  # keep the connection open until the client closes it

    server = await serve(script)
    pool = UpstreamPool()
    answer = await pool.request(server.address, "POST", "/", [], b"", deadline())
    assert answer.header(b"content-type") == b"text/event-stream"
    chunks = answer.chunks(idle_timeout_s=5.0)
    assert await anext(chunks) == b"data: 1\n\n"  # before the second one is even written
    second_may_go.set()
    assert [chunk async for chunk in chunks] == [b"data: 2\n\n"]
    answer.release()
    assert pool.num_idle(server.address) == 1


async def test_a_refused_connection_is_connect_failed() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(ConnectFailed):
        await post(UpstreamPool(), f"http://127.0.0.1:{port}")


async def test_a_close_mid_body_is_broken_and_the_connection_is_dropped(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"par')
        await writer.drain()

    server = await serve(script)
    pool = UpstreamPool()
    answer = await pool.request(server.address, "POST", "/", [], b"", deadline())
    with pytest.raises(ConnectionBroken):
        await answer.read()
    assert pool.num_idle(server.address) == 0


async def test_a_close_before_any_answer_is_broken(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)

    server = await serve(script)
    with pytest.raises(ConnectionBroken):
        await post(UpstreamPool(), server.address)


async def test_garbage_is_broken(serve: Callable[[Script], Awaitable[ScriptedServer]]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await reader.read()

    server = await serve(script)
    with pytest.raises(ConnectionBroken):
        await post(UpstreamPool(), server.address)


async def test_silence_past_the_deadline_is_a_timeout_and_the_connection_is_closed(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    closed = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        await reader.read()  # never answers; returns when the client closes
        closed.set()

    server = await serve(script)
    pool = UpstreamPool()
    with pytest.raises(UpstreamTimeout):
        await post(pool, server.address, deadline=deadline(0.05))
    await closed.wait()
    assert pool.num_idle(server.address) == 0


async def test_connection_close_is_honoured(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}")

    server = await serve(script)
    pool = UpstreamPool()
    assert await post(pool, server.address) == b"{}"
    assert pool.num_idle(server.address) == 0
    assert await post(pool, server.address) == b"{}"
    assert server.num_connections == 2


async def test_a_cancelled_request_frees_its_slot_and_socket(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    received = asyncio.Event()
    closed = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        if len(server.requests) == 1:
            received.set()
            await reader.read()  # the first request is never answered
            closed.set()
            return
        writer.write(OK)

    server = await serve(script)
    pool = UpstreamPool(PoolLimits(max_connections=1))
    # The deadline is far off: only the cancellation can close the socket in time.
    waiting = asyncio.ensure_future(post(pool, server.address, deadline=deadline(60)))
    await received.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.wait_for(closed.wait(), 2.0)  # the abandoned exchange's socket was closed
    assert await post(pool, server.address) == b"{}"  # and its slot is free again


async def test_no_free_slot_before_the_deadline_is_a_timeout(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await reader.read()

    server = await serve(script)
    pool = UpstreamPool(PoolLimits(max_connections=1))
    held = await pool.request(server.address, "POST", "/", [], b"", deadline())
    with pytest.raises(UpstreamTimeout):
        await post(pool, server.address, deadline=deadline(0.02))
    held.release()


async def test_idle_connections_expire_and_are_capped(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            writer.write(OK)

    server = await serve(script)
    now = [0.0]
    pool = UpstreamPool(PoolLimits(idle_expiry_s=4.0), clock=lambda: now[0])
    await post(pool, server.address)
    now[0] = 3.9
    await post(pool, server.address)
    assert server.num_connections == 1
    now[0] = 8.0  # idle since 3.9: expired
    await post(pool, server.address)
    assert server.num_connections == 2
    uncapped = UpstreamPool(PoolLimits(max_idle_per_worker=0))
    await post(uncapped, server.address)
    assert uncapped.num_idle(server.address) == 0


async def test_a_stream_the_client_does_not_take_pauses_the_worker(
    serve: Callable[[Script], Awaitable[ScriptedServer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection_module, "HIGH_WATER_BYTES", 1000)
    piece = b"x" * 600

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6000\r\n\r\n" + piece * 10)
        await reader.read()

    server = await serve(script)
    pool = UpstreamPool()
    answer = await pool.request(server.address, "POST", "/", [], b"", deadline())
    received = b"".join([chunk async for chunk in answer.chunks(idle_timeout_s=5.0)])
    assert received == piece * 10
    answer.release()
    assert pool.num_idle(server.address) == 1


def test_addresses_and_heads() -> None:
    origin = parse_origin("http://w1:8001")
    assert (origin.host, origin.port, origin.host_header) == ("w1", 8001, b"w1:8001")
    assert parse_origin("http://w1").port == 80
    for bad in ("https://w1", "w1:8001", "http://"):
        with pytest.raises(ValueError):
            parse_origin(bad)
    head = encode_head("POST", "/v1/x", origin, [(b"a", b"1")], 5)
    assert head == b"POST /v1/x HTTP/1.1\r\nhost: w1:8001\r\ncontent-length: 5\r\na: 1\r\n\r\n"
    with pytest.raises(ValueError):
        PoolLimits(max_connections=0)


async def test_an_interim_100_continue_is_skipped_and_the_real_answer_read(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await server.read_request(reader)
            tag = request.rsplit(b"\r\n\r\n", 1)[1]
            body = b'{"for":"%s"}' % tag
            # Interim answers may come in their own write or with the final one (RFC 9110).
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    server = await serve(script)
    pool = UpstreamPool()
    for tag in (b"a", b"b", b"c"):
        answer = await pool.request(server.address, "POST", "/", [], tag, deadline())
        assert answer.status == 200
        assert answer.header(b"link") is None  # the interim answer's headers are not kept
        assert await answer.read() == b'{"for":"%s"}' % tag
    assert server.num_connections == 1  # complete answers: the connection was reused


async def test_a_switching_protocols_answer_is_broken(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n")
        await reader.read()

    server = await serve(script)
    pool = UpstreamPool()
    with pytest.raises(ConnectionBroken):
        await pool.request(server.address, "POST", "/", [], b"", deadline())
    assert pool.num_idle(server.address) == 0


async def test_bytes_after_a_complete_answer_are_never_taken_for_the_next_one(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    """A worker that answers twice (a stray answer after the real one, in the same write or
    later) must not have its extra answer handed to the next request on that connection."""
    stray_sent = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await server.read_request(reader)
            tag = request.rsplit(b"\r\n\r\n", 1)[1]
            body = b'{"for":"%s"}' % tag
            answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            if tag == b"first":
                writer.write(answer + b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n")
                await writer.drain()
                writer.write(b'{"stray"}')
                stray_sent.set()
            elif tag == b"second":
                writer.write(answer)
                await writer.drain()
                await asyncio.sleep(0)
                writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n{"stray"}')
                await writer.drain()
                stray_sent.set()
            else:
                writer.write(answer)

    server = await serve(script)
    pool = UpstreamPool()
    for tag in (b"first", b"second"):
        stray_sent.clear()
        answer = await pool.request(server.address, "POST", "/", [], tag, deadline())
        assert await answer.read() == b'{"for":"%s"}' % tag
        await stray_sent.wait()
        await asyncio.sleep(0.05)  # let the stray bytes land on the (now idle) connection
        answer = await pool.request(server.address, "POST", "/", [], b"next", deadline())
        assert await answer.read() == b'{"for":"next"}'
    assert server.num_connections >= 3  # each poisoned connection was dropped, not reused


async def test_a_kept_alive_connection_closed_unanswered_is_retried_once_on_a_fresh_one(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    """A worker may close an idle connection (its keep-alive ran out, or its connection
    budget made way) just as the gateway reuses it: the request was never read, so it goes
    once more on a new connection instead of failing (and ejecting a healthy worker)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)
        writer.write(OK)
        await writer.drain()
        if server.num_connections == 1:  # the first connection: closed at its next request
            await server.read_request(reader)

    server = await serve(script)
    pool = UpstreamPool()
    assert await post(pool, server.address) == b"{}"
    assert await post(pool, server.address) == b"{}"  # the reused one broke: a new one served
    assert server.num_connections == 2


async def test_a_fresh_connection_closed_unanswered_is_broken_not_retried(
    serve: Callable[[Script], Awaitable[ScriptedServer]],
) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.read_request(reader)  # and close without answering

    server = await serve(script)
    pool = UpstreamPool()
    with pytest.raises(ConnectionBroken):
        await post(pool, server.address)
    assert server.num_connections == 1
