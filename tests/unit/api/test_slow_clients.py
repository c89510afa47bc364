"""The slow-client protocol's timers, driven by hand: no real clock, no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from conveyor.api.disconnect import DISCONNECT_HOOK, DisconnectHook
from conveyor.api.slow_clients import (
    ReadTimeouts,
    SlowClientProtocol,
    slow_client_protocol,
    timeout_response,
)

pytestmark = pytest.mark.anyio

TIMEOUTS = ReadTimeouts(header_timeout_s=10.0, body_timeout_s=30.0)
HEAD = b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"


class Timer:
    """A timer the test's clock fires."""

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.is_cancelled = False

    def cancel(self) -> None:
        self.is_cancelled = True


class FakeClockLoop:
    """The running loop for tasks; time moves only when the test advances it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.now = 1000.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        self.timers.append(Timer(when, callback))
        return self.timers[-1]

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.now + delay_s, callback)

    def create_task(self, coro: Coroutine[Any, Any, None], **kwargs: Any) -> asyncio.Task[None]:
        return self.loop.create_task(coro, **kwargs)

    def armed(self) -> list[Timer]:
        return [t for t in self.timers if not t.is_cancelled]

    def advance(self, seconds: float) -> None:
        """Move the clock, firing every timer that falls due on the way, in order."""
        end = self.now + seconds
        while due := sorted((t for t in self.armed() if t.when <= end), key=lambda t: t.when):
            timer = due[0]
            self.now = max(self.now, timer.when)
            timer.cancel()
            timer.callback()
        self.now = end


class Transport(asyncio.Transport):
    """Collects what the server writes; knows whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.is_closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.is_closed = True

    def is_closing(self) -> bool:
        return self.is_closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8000)}.get(name)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def echo_length(scope: Scope, receive: Receive, send: Send) -> None:
    """Read the whole body, answer 200."""
    more_body = True
    while more_body:
        message = await receive()
        more_body = message.get("more_body", False)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
    )
    await send({"type": "http.response.body", "body": b""})


async def apps_done(protocol: SlowClientProtocol) -> None:
    """Wait until every request the protocol started has been answered."""
    await asyncio.gather(*protocol.tasks)


def connect() -> tuple[SlowClientProtocol, FakeClockLoop, Transport]:
    loop = FakeClockLoop(asyncio.get_running_loop())
    config = uvicorn.Config(echo_length, http="httptools", log_level="warning")
    protocol_class = slow_client_protocol(TIMEOUTS)
    protocol = protocol_class(config, ServerState(), {}, _loop=loop)  # type: ignore[arg-type]
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, loop, transport


async def test_a_connection_that_sends_nothing_is_closed_quietly() -> None:
    _, loop, transport = connect()
    loop.advance(TIMEOUTS.header_timeout_s - 0.1)
    assert not transport.is_closed
    loop.advance(0.1)
    assert transport.is_closed and transport.written == b""


async def test_a_trickled_head_gets_408_at_the_header_timeout() -> None:
    protocol, loop, transport = connect()
    loop.advance(5)
    protocol.data_received(HEAD[:5])  # the clock runs from connect time: not restarted
    loop.advance(TIMEOUTS.header_timeout_s - 5 - 0.1)
    assert not transport.is_closed
    loop.advance(0.1)
    assert transport.written.startswith(b"HTTP/1.1 408 ")
    assert b"request_timeout" in transport.written and transport.is_closed


async def test_the_body_clock_restarts_with_each_chunk_and_stops_when_complete() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nab")
    loop.advance(TIMEOUTS.body_timeout_s - 1)
    protocol.data_received(b"c")
    loop.advance(TIMEOUTS.body_timeout_s - 1)  # long after the head, not after the chunk
    assert not transport.is_closed
    protocol.data_received(b"d")
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    loop.advance(3)  # within uvicorn's keep-alive: our clocks are off between requests
    assert not transport.is_closed
    assert len(loop.armed()) <= 2  # ours (lazy, about to lapse) and uvicorn's keep-alive


async def test_a_stalled_body_gets_408_and_the_app_sees_a_disconnect() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nab")
    loop.advance(TIMEOUTS.body_timeout_s)
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 408 ")
    assert b"HTTP/1.1 200" not in transport.written  # the app's answer never follows the 408
    assert transport.is_closed


async def test_a_body_we_stopped_reading_is_not_the_clients_fault() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nab")
    protocol.flow.pause_reading()
    loop.advance(TIMEOUTS.body_timeout_s)
    assert not transport.is_closed
    protocol.flow.resume_reading()  # from here the client must move again, in time
    loop.advance(TIMEOUTS.body_timeout_s)
    assert transport.is_closed and transport.written.startswith(b"HTTP/1.1 408 ")


async def test_a_later_request_gets_its_own_header_clock() -> None:
    protocol, loop, transport = connect()
    protocol.data_received(HEAD + b"\r\nabcd")
    await apps_done(protocol)
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    loop.advance(1)
    protocol.data_received(b"GET")  # uvicorn's keep-alive timer is now off: ours is on
    loop.advance(TIMEOUTS.header_timeout_s - 0.1)
    assert not transport.is_closed
    loop.advance(0.1)
    assert transport.is_closed and transport.written.count(b"HTTP/1.1 408 ") == 1


async def test_one_timer_serves_many_requests_on_a_connection() -> None:
    protocol, loop, transport = connect()
    for _ in range(50):
        protocol.data_received(HEAD + b"\r\nabcd")
        await apps_done(protocol)
        loop.advance(0.001)
    ours = [t for t in loop.timers if t.callback == protocol._check_deadline]
    assert len(ours) == 1  # armed at connect, never re-armed per request
    assert transport.written.count(b"HTTP/1.1 200 ") == 50


def test_timeout_response_is_complete_http() -> None:
    raw = timeout_response("too slow")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(body) in head and b"connection: close" in head


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        ReadTimeouts(header_timeout_s=0, body_timeout_s=1)


def _hook(protocol: SlowClientProtocol) -> DisconnectHook:
    hook = protocol.scope["extensions"][DISCONNECT_HOOK]
    assert isinstance(hook, DisconnectHook)
    return hook


async def test_a_lost_connection_fires_the_hook_of_the_request_in_flight() -> None:
    protocol, _, _ = connect()
    protocol.data_received(HEAD + b"\r\nab")  # the body is not complete: no answer yet
    hook = _hook(protocol)
    calls: list[str] = []
    hook.watch(lambda: calls.append("gone"))
    protocol.connection_lost(None)
    assert calls == ["gone"] and hook.is_fired
    await apps_done(protocol)


async def test_an_answered_request_retires_its_hook() -> None:
    protocol, _, _ = connect()
    protocol.data_received(HEAD + b"\r\nabcd")
    hook = _hook(protocol)
    hook.watch(lambda: pytest.fail("an answered request is not told of a later disconnect"))
    await apps_done(protocol)
    protocol.connection_lost(None)
    assert not hook.is_fired
