"""One keep-alive HTTP/1.1 connection to a worker, as an asyncio protocol: the wire side
of the gateway's upstream pool (``fleet.upstream``).

httptools' C parser reads the answers; the request head and body go to the socket in one
write; a deadline is one timer on the event loop. A connection carries exactly one answer
per request. Interim answers (``100 Continue``, ``103 Early Hints``) are skipped; anything
a worker sends beyond the one final answer (a second answer in the same exchange, or bytes
while the connection sits idle) means the connection is out of step, and it is closed
rather than pooled: the next request on it, from any caller, must never read an answer
meant for another.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
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
class Origin:
    """A worker address, split once: where to connect and what ``Host`` to send."""

    host: str
    port: int
    host_header: bytes


def parse_origin(address: str) -> Origin:
    """``http://host:port`` as host, port and Host header; only plain http is spoken."""
    parts = urlsplit(address)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"worker address must be http://host[:port], got {address!r}")
    port = parts.port or 80
    return Origin(parts.hostname, port, parts.netloc.encode("ascii"))


def encode_head(
    method: str, target: str, origin: Origin, headers: Sequence[tuple[bytes, bytes]], length: int
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


class Connection(asyncio.Protocol):
    """One keep-alive connection to a worker, carrying one exchange at a time."""

    def __init__(self, origin: Origin) -> None:
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
