"""The server protocol driven by hand: a loop whose clock only the test moves, and a
transport that records what the server writes. No real clock, no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.server import ServerState

from conveyor.api.connection_limits import ReadTimeouts
from conveyor.api.slow_clients import SlowClientProtocol, slow_client_protocol

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
    """Collects what the server writes; knows whether it was closed or half-closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.is_closed = False
        self.is_eof_written = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.is_eof_written, "written after the FIN"
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.is_eof_written = True

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


async def refuse_unread(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer 401 without reading the body, as the API-key check does."""
    await send(
        {"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]}
    )
    await send({"type": "http.response.body", "body": b""})


async def apps_done(protocol: SlowClientProtocol) -> None:
    """Wait until every request the protocol started has been answered."""
    await asyncio.gather(*protocol.tasks)


class Server:
    """Connections to one protocol class (one budget) on one fake loop."""

    def __init__(
        self, protocol_class: type[SlowClientProtocol] | None = None, app: ASGIApp = echo_length
    ) -> None:
        self.loop = FakeClockLoop(asyncio.get_running_loop())
        self.config = uvicorn.Config(app, http="httptools", log_level="warning")
        self.protocol_class = protocol_class or slow_client_protocol(TIMEOUTS)
        self.state = ServerState()

    def connect(self) -> tuple[SlowClientProtocol, Transport]:
        protocol = self.protocol_class(self.config, self.state, {}, _loop=self.loop)  # type: ignore[arg-type]
        transport = Transport()
        protocol.connection_made(transport)
        return protocol, transport


def connect(
    protocol_class: type[SlowClientProtocol] | None = None, app: ASGIApp = echo_length
) -> tuple[SlowClientProtocol, FakeClockLoop, Transport]:
    """One connection to a server of its own."""
    server = Server(protocol_class, app)
    protocol, transport = server.connect()
    return protocol, server.loop, transport
