"""A lean pooled HTTP/1.1 client for the gateway's trips to workers.

Built the way reverse proxies keep an upstream hop cheap (nginx's upstream ``keepalive``,
Envoy's HTTP/1 connection pool): one asyncio protocol per keep-alive connection, httptools'
C parser for the answers, the request head and body handed to the socket in one write,
idle connections reused newest first, and a deadline that is one timer on the event loop.
There are no per-request layers (auth flows, redirects, cookies, URL objects) to pay for.

A response's body is read whole (``read``) or relayed chunk by chunk (``chunks``); a
relayed stream stops reading from the worker while the client falls behind.

A connection carries exactly one answer per request. Interim answers (``100 Continue``,
``103 Early Hints``) are skipped; anything a worker sends beyond the one final answer (a
second answer in the same exchange, or bytes while the connection sits idle) means the
connection is out of step, and it is closed rather than pooled: the next request on it,
from any caller, must never read an answer meant for another.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

# A relayed stream stops reading from the worker above this many unsent bytes...
HIGH_WATER_BYTES = 256 * 1024
# ...and starts again below this many.
LOW_WATER_BYTES = 64 * 1024


class UpstreamError(Exception):
    """A trip to a worker failed."""


class ConnectFailed(UpstreamError):
    """No connection could be opened: refused, unreachable, or the connect timed out."""


class ConnectionBroken(UpstreamError):
    """The connection failed before the answer was complete: reset, closed, or garbled."""


class UpstreamTimeout(UpstreamError):
    """The worker did not answer (or went quiet mid-answer) within the time allowed."""


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """How many connections, how many kept idle per worker, and for how long."""

    max_connections: int = 256
    max_idle_per_worker: int = 64
    # Shorter than the workers' keep-alive, so a reused socket is never one the worker is
    # closing (that would look like a reset and eject a healthy worker).
    idle_expiry_s: float = 4.0
    connect_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        """Validate the limits."""
        if self.max_connections < 1 or self.max_idle_per_worker < 0:
            raise ValueError("max_connections must be >= 1 and max_idle_per_worker >= 0")
        if self.idle_expiry_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("idle_expiry_s and connect_timeout_s must be > 0")


@dataclass(frozen=True, slots=True)
class _Origin:
    """A worker address, split once: where to connect and what ``Host`` to send."""

    host: str
    port: int
    host_header: bytes


def parse_origin(address: str) -> _Origin:
    """``http://host:port`` as host, port and Host header; only plain http is spoken."""
    parts = urlsplit(address)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"worker address must be http://host[:port], got {address!r}")
    port = parts.port or 80
    return _Origin(parts.hostname, port, parts.netloc.encode("ascii"))


def encode_head(
    method: str, target: str, origin: _Origin, headers: Sequence[tuple[bytes, bytes]], length: int
) -> bytes:
    """The request line and headers, with our own ``Host`` and ``Content-Length``."""
    parts = [
        b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n"
        % (method.encode("ascii"), target.encode("latin-1"), origin.host_header, length)
    ]
    for name, value in headers:
        parts.append(b"%s: %s\r\n" % (name, value))
    parts.append(b"\r\n")
    return b"".join(parts)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, carrying one exchange at a time."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._is_reading_paused = False
        self._is_in_exchange = False
        self._begin()

    def _begin(self) -> None:
        """Forget the last exchange."""
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.has_headers = False
        self.is_complete = False
        self.is_keep_alive = False
        self.has_received = False  # any byte of an answer to this exchange
        # A 1xx answer is being parsed: its headers and its end are not the answer's.
        self._is_interim = False
        self.error: UpstreamError | None = None
        self.chunks: deque[bytes] = deque()
        self.num_buffered_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def is_usable(self) -> bool:
        """Open and between exchanges."""
        return self.transport is not None and not self.transport.is_closing()

    # -- asyncio.Protocol -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport (uvloop's quacks like ``asyncio.Transport``)."""
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        """Feed the parser; its callbacks fill in the exchange."""
        if not self._is_in_exchange:  # nothing was asked: the worker is out of step
            self.close()
            return
        self.has_received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(ConnectionBroken(f"unparseable answer from the worker: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        """Closed by either side: an exchange still running has failed."""
        self.transport = None
        if not self.is_complete and self.error is None:
            self.fail(ConnectionBroken(f"the worker closed the connection ({exc or 'EOF'})"))

    # -- httptools callbacks ----------------------------------------------------
    def on_message_begin(self) -> None:
        """An answer starts; a second final answer in one exchange ends the connection."""
        if self.is_complete:
            self.close()  # the exchange keeps its answer; no other caller gets the rest

    def on_header(self, name: bytes, value: bytes) -> None:
        """Collect a response header."""
        if not self.is_complete:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        """Status line and headers are in (of an interim answer: forget them)."""
        if self.is_complete:
            return
        status = self._parser.get_status_code()
        if status == 101:
            self.fail(ConnectionBroken("the worker switched protocols"))
        elif 100 <= status < 200:
            self._is_interim = True
            self.headers = []
        else:
            self.status = status
            self.has_headers = True
            self._wake()

    def on_body(self, body: bytes) -> None:
        """A piece of the body (de-chunked); pause reading if the consumer lags."""
        if self.is_complete:
            return
        self.chunks.append(body)
        self.num_buffered_bytes += len(body)
        if self.num_buffered_bytes > HIGH_WATER_BYTES and self.transport is not None:
            self.transport.pause_reading()
            self._is_reading_paused = True
        self._wake()

    def on_message_complete(self) -> None:
        """The whole answer is in (the parser knows keep-alive only now, not after)."""
        if self._is_interim:
            self._is_interim = False
            return
        if self.is_complete:
            return
        self.is_keep_alive = self._parser.should_keep_alive()
        self.is_complete = True
        self._cancel_timer()
        self._wake()

    # -- the exchange -----------------------------------------------------------
    def start(self, request: bytes, deadline: float) -> None:
        """Send a whole request; the answer must be complete by ``deadline`` (loop time)."""
        self._begin()
        self._is_in_exchange = True
        self.arm_timer(deadline)
        assert self.transport is not None
        self.transport.write(request)

    def end_exchange(self) -> None:
        """The caller is done with the answer: from now on the worker should be silent."""
        self._is_in_exchange = False
        self._cancel_timer()

    def arm_timer(self, deadline: float) -> None:
        """Fail the exchange with ``UpstreamTimeout`` unless it completes by ``deadline``."""
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(deadline, self._on_timeout)

    def _on_timeout(self) -> None:
        self._timer = None
        self.fail(UpstreamTimeout("the worker did not answer in time"))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def fail(self, error: UpstreamError) -> None:
        """End the exchange with ``error`` and drop the connection."""
        if self.error is None:
            self.error = error
        self._cancel_timer()
        self.close()
        self._wake()

    def close(self) -> None:
        """Close the socket (the connection is never reused)."""
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def take_chunks(self) -> list[bytes]:
        """The body bytes received so far; resumes reading once the backlog is small."""
        taken = list(self.chunks)
        self.chunks.clear()
        self.num_buffered_bytes = 0
        if self._is_reading_paused and self.transport is not None:
            self.transport.resume_reading()
            self._is_reading_paused = False
        return taken

    async def wait(self) -> None:
        """Until something changes: headers, a body chunk, the end, or a failure."""
        if self.error is not None:
            raise self.error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def can_keep_alive(self) -> bool:
        """Complete, unbroken, and the worker did not ask to close."""
        return self.is_complete and self.is_keep_alive and self.error is None and self.is_usable


class UpstreamResponse:
    """A worker's answer: status and headers now, the body by ``read`` or ``chunks``.

    Call ``release`` exactly when done with it (``read`` does so itself): the connection
    goes back to the pool if the answer was complete, and is closed otherwise.
    """

    def __init__(self, pool: UpstreamPool, connection: _Connection) -> None:
        self._pool = pool
        self._connection = connection
        self.status = connection.status
        self.headers = connection.headers
        self._is_released = False

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The whole body, within the exchange's deadline; then releases the connection."""
        connection = self._connection
        try:
            while not connection.is_complete:
                await connection.wait()
            return b"".join(connection.take_chunks())
        finally:
            self.release()

    async def chunks(self, idle_timeout_s: float) -> AsyncIterator[bytes]:
        """The body as it arrives; fails if the worker is silent for ``idle_timeout_s``."""
        connection = self._connection
        loop = asyncio.get_running_loop()
        while True:
            connection.arm_timer(loop.time() + idle_timeout_s)
            while not connection.chunks and not connection.is_complete:
                await connection.wait()
            for chunk in connection.take_chunks():
                yield chunk
            if connection.is_complete:
                return

    def release(self) -> None:
        """Give the connection back (complete answer) or close it (anything else)."""
        if not self._is_released:
            self._is_released = True
            self._pool.give_back(self._connection)


class UpstreamPool:
    """Keep-alive connections to workers, at most ``max_connections`` in use at once."""

    def __init__(
        self, limits: PoolLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or PoolLimits()
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._slots = asyncio.Semaphore(self.limits.max_connections)
        self._clock = clock

    def num_idle(self, address: str) -> int:
        """Idle connections kept for ``address``."""
        origin = self._origins.get(address)
        return len(self._idle.get(origin, ())) if origin else 0

    async def request(
        self,
        address: str,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        deadline: float,
    ) -> UpstreamResponse:
        """Send one request to the worker at ``address``; return once its headers are in.

        ``deadline`` (event-loop time) bounds the whole answer; the connect alone is also
        bounded by ``connect_timeout_s``. Raises ``ConnectFailed``, ``ConnectionBroken`` or
        ``UpstreamTimeout``.
        """
        origin = self._origins.get(address)
        if origin is None:
            origin = self._origins[address] = parse_origin(address)
        request = encode_head(method, target, origin, headers, len(body)) + body
        await self._take_slot(deadline)
        connection: _Connection | None = None
        try:
            connection = self._idle_connection(origin)
            if connection is not None:
                try:
                    await self._exchange(connection, request, deadline)
                    return UpstreamResponse(self, connection)
                except ConnectionBroken:
                    if connection.has_received:
                        raise
                    # Closed with no byte answered: most likely the worker ended the idle
                    # connection as it was reused (its keep-alive ran out, or its connection
                    # budget made way). As HTTP clients do, once more on a fresh connection.
            connection = await self._new_connection(origin, deadline)
            await self._exchange(connection, request, deadline)
        except BaseException:  # cancelled too: the slot and the socket must not leak
            self._slots.release()
            if connection is not None:
                connection.fail(ConnectionBroken("the exchange was abandoned"))
            raise
        return UpstreamResponse(self, connection)

    @staticmethod
    async def _exchange(connection: _Connection, request: bytes, deadline: float) -> None:
        """Send ``request`` and wait for the answer's status line and headers."""
        connection.start(request, deadline)
        while not connection.has_headers:
            await connection.wait()

    async def _take_slot(self, deadline: float) -> None:
        if not self._slots.locked():
            await self._slots.acquire()
            return
        remaining_s = deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(self._slots.acquire(), max(0.0, remaining_s))
        except TimeoutError:
            raise UpstreamTimeout("no connection to a worker came free in time") from None

    def _idle_connection(self, origin: _Origin) -> _Connection | None:
        """The newest idle connection to ``origin`` still open and not expired, if any."""
        idle = self._idle.get(origin)
        now = self._clock()
        while idle:
            connection = idle.pop()
            if connection.is_usable and now - connection.idle_since < self.limits.idle_expiry_s:
                return connection
            connection.close()
        return None

    async def _new_connection(self, origin: _Origin, deadline: float) -> _Connection:
        """A new connection, within ``connect_timeout_s`` and the deadline."""
        loop = asyncio.get_running_loop()
        timeout_s = min(self.limits.connect_timeout_s, max(0.0, deadline - loop.time()))
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(origin), origin.host, origin.port),
                timeout_s,
            )
        except TimeoutError:
            raise ConnectFailed(f"connecting to {origin.host}:{origin.port} timed out") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {exc}") from None
        return connection

    def give_back(self, connection: _Connection) -> None:
        """End an exchange: keep the connection idle if it can carry another."""
        self._slots.release()
        connection.end_exchange()
        idle = self._idle.setdefault(connection.origin, [])
        if connection.can_keep_alive() and len(idle) < self.limits.max_idle_per_worker:
            connection.idle_since = self._clock()
            idle.append(connection)
        else:
            connection.fail(ConnectionBroken("released before the answer was complete"))

    def close(self) -> None:
        """Close every idle connection (those in use close when released)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
