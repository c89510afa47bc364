"""Connection-level guards: uvicorn's httptools protocol plus read clocks, head limits,
the connection budget and lingering closes.

uvicorn bounds only the idle time between keep-alive requests; a client that trickles
its request head or body holds a connection (and a place under the connection cap)
for as long as it likes, and a head may be any size. This protocol, like nginx's
``client_header_timeout`` and ``client_body_timeout`` and Apache's ``MinRate``:

- closes a connection that has not delivered a whole request head within
  ``header_timeout_s`` of connecting (or of the first byte of a later request), or whose
  body goes ``body_timeout_s`` without a byte or, after ``body_timeout_s`` of grace,
  arrives slower than ``body_min_bytes_per_s`` on average (408 when owed an answer);
- answers 431 to a head over ``max_header_bytes`` (request line and fields) or with more
  than ``max_headers`` fields, before any app runs;
- keeps ``max_connections`` for requests in progress (`ConnectionBudget`): a connection
  without one makes way for a new connection when every place is taken;
- closes a connection whose request was answered before its body was all read (a 401 or
  413 at the head), lingering: the answer goes out with a FIN and what the client still
  sends is read and dropped for a while (``Linger``), since closing on unread bytes
  resets the connection and the client may lose the answer with it.

Its own answers (400 for what is not HTTP, 408, 431, 503) are in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from conveyor.api.connection_budget import ConnectionBudget
from conveyor.api.connection_limits import (
    HeadLimits,
    Linger,
    ReadTimeouts,
    answer_at_capacity,
    error_bytes,
    too_many_connections,
)
from conveyor.asgi.disconnect import DISCONNECT_HOOK, DisconnectHook
from conveyor.errors import ConveyorError, HeadersTooLarge, InvalidRequest, RequestTimeout

log = logging.getLogger(__name__)


class AnswerTransport(asyncio.Transport):
    """What uvicorn's request cycles write their answers through: the connection's own
    transport, except that closing it after an answer is the protocol's lingering close."""

    def __init__(self, protocol: SlowClientProtocol) -> None:
        super().__init__()
        self._protocol = protocol

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write to the connection."""
        self._protocol.transport.write(data)

    def is_closing(self) -> bool:
        """Closing, or serving no more requests."""
        return self._protocol.is_done or self._protocol.transport.is_closing()

    def close(self) -> None:
        """The answer is complete and the connection is not kept alive."""
        self._protocol.close_answered()


@dataclass(slots=True)
class _Body:
    """The clock of the request body being read."""

    started_s: float
    last_byte_s: float
    num_bytes: int = 0


@dataclass(slots=True)
class _Reading:
    """Where a connection stands in reading its requests."""

    is_reading_head: bool = False
    is_in_body: bool = False
    head_bytes: int = 0  # of the head being read, counted per read
    num_complete: int = 0  # requests read whole
    keep_alive: bool = True  # the parser's verdict, held back until the body is in
    body: _Body = field(default_factory=lambda: _Body(0.0, 0.0))


class SlowClientProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read clocks, head limits, the connection budget
    and lingering closes (see the module).

    Use ``slow_client_protocol(...)``, which sets the limits (and a budget of its own) on
    a subclass: uvicorn builds protocols from a class and its own config only.

    The clocks are deadlines, not timers: a request moves a float, and one lazy timer per
    connection checks the deadline when it fires (at most ``min(timeouts)`` apart, so it is
    never late for a deadline set after it was armed), re-arming only while a clock runs.
    """

    timeouts = ReadTimeouts(header_timeout_s=10.0, body_timeout_s=30.0)
    head_limits = HeadLimits()
    linger = Linger()
    budget: ConnectionBudget[SlowClientProtocol] | None = None
    _read_timer: asyncio.TimerHandle | None = None
    _timer_due = 0.0
    _deadline: float | None = None
    _on_deadline: Callable[[], None] | None = None
    # Set once the connection serves no more requests (refused, evicted or lingering).
    is_done = False
    _is_lingering = False
    _lingered_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start the clock for the first request head at connect time; take a place."""
        super().connection_made(transport)  # type: ignore[arg-type]
        # The disconnect hooks of requests not yet answered, oldest first.
        self._hooks: deque[DisconnectHook] = deque()
        self._reading = _Reading()
        self._answers = AnswerTransport(self)
        self._set_deadline(self.timeouts.header_timeout_s, self._on_header_timeout)
        if self.budget is not None:
            evicted = self.budget.open(self)
            if evicted is not None:
                evicted.make_way()

    def connection_lost(self, exc: Exception | None) -> None:
        """No timer outlives its connection, nor its place in the budget."""
        self._deadline = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        if self.budget is not None:
            self.budget.close(self)
        super().connection_lost(exc)
        while self._hooks:
            self._hooks.popleft().fire()

    def data_received(self, data: bytes) -> None:
        """Parse ``data``, but no head past ``max_header_bytes``: a head still incomplete
        there gets 431. Bytes that follow an early answer are dropped (lingering)."""
        if self.is_done:
            self._drop(len(data))
            return
        reading = self._reading
        room = self.head_limits.max_header_bytes - reading.head_bytes
        if reading.is_in_body or len(data) <= room:
            if not reading.is_in_body:
                reading.head_bytes += len(data)
            # Counted per read: a head that begins within this read (pipelined after a
            # body) is counted from the next one, so it may pass by up to one read.
            super().data_received(data)
            return
        num_complete = reading.num_complete
        super().data_received(data[:room])
        if self.is_done:
            return
        if not reading.is_in_body and reading.num_complete == num_complete:
            self._refuse_head(f"longer than {self.head_limits.max_header_bytes} bytes")
            return
        self.data_received(data[room:])  # the head ended within its room

    def on_message_begin(self) -> None:
        """A later request's first byte starts its own header clock."""
        super().on_message_begin()
        self._reading.is_reading_head = True
        if self._deadline is None:
            self._set_deadline(self.timeouts.header_timeout_s, self._on_header_timeout)

    def on_headers_complete(self) -> None:
        """The head is in: the request takes a place (503 if none is free) and from now on
        the body must keep moving. The request's scope gets a `DisconnectHook`, so a handler
        learns of a lost connection without a task."""
        if self.is_done:
            return
        # Counted once the head is in (not per field, on every request): the byte limit
        # already bounds what so many fields can cost until then.
        if len(self.headers) > self.head_limits.max_headers:
            self._refuse_head(f"with more than {self.head_limits.max_headers} fields")
            return
        reading = self._reading
        reading.is_reading_head, reading.is_in_body = False, True
        self._start_body_clock()
        hook = DisconnectHook()
        scope = cast(dict[str, Any], self.scope)  # uvicorn types extensions narrowly
        scope["extensions"] = {**scope.get("extensions", {}), DISCONNECT_HOOK: hook}
        self._hooks.append(hook)
        previous, budget = self.cycle, self.budget
        if budget is None or (len(self.tasks) < budget.capacity and budget.start(self)):
            super().on_headers_complete()
        else:
            self._refuse_at_capacity()
        cycle = self.cycle
        if cycle is previous:
            return  # an upgrade: uvicorn hands the connection over
        # An answer sent before the body is all read closes the connection, lingering:
        # until the body is in (`on_message_complete`) keep-alive is held back and the
        # answer goes through `AnswerTransport`.
        cycle.transport = self._answers
        reading.keep_alive, cycle.keep_alive = cycle.keep_alive, False

    def _refuse_at_capacity(self) -> None:
        """uvicorn's start of the request, with the app that answers 503."""
        app, self.app = self.app, answer_at_capacity
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_body(self, body: bytes) -> None:
        """Each chunk of body moves the body clock."""
        if self.is_done:
            return
        clock = self._reading.body
        clock.num_bytes += len(body)
        clock.last_byte_s = self.loop.time()
        self._deadline = self.timeouts.body_deadline(
            clock.started_s, clock.num_bytes, clock.last_byte_s
        )
        super().on_body(body)

    def on_message_complete(self) -> None:
        """The whole request is in: nothing more to wait for from the client, and the
        connection may be kept alive after the answer."""
        if self.is_done:
            return
        reading = self._reading
        reading.is_in_body, reading.head_bytes = False, 0
        reading.num_complete += 1
        self._deadline = None
        cycle = self.cycle
        if not cycle.response_started:
            cycle.keep_alive, cycle.transport = reading.keep_alive, self.transport
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """Answers go out in request order: the oldest request's hook retires, and the
        connection waits for its next request (making way for new ones meanwhile)."""
        if self._hooks:
            self._hooks.popleft()
        super().on_response_complete()
        if self._is_lingering:
            self._unset_keepalive_if_required()  # the linger's own bound closes it
        elif self.budget is not None and not self.pipeline and not self.transport.is_closing():
            self.budget.wait(self)

    def shutdown(self) -> None:
        """A graceful shutdown: no keep-alive after the request in progress."""
        self._reading.keep_alive = False
        if self._is_lingering:
            self.transport.close()
            return
        super().shutdown()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not an HTTP/1.1 request, in OpenAI's shape."""
        error = InvalidRequest("the request is not valid HTTP/1.1", code="invalid_http")
        self._refuse(error if self._is_owed_answer() else None)

    def make_way(self) -> None:
        """Close for a newer connection: 503 if a request head had begun, else quietly."""
        self._refuse(too_many_connections() if self._reading.is_reading_head else None)

    def close_answered(self) -> None:
        """uvicorn closes after an answer: lingering while the client may still be sending."""
        if self.is_done:
            return
        if self._reading.is_in_body or self._reading.is_reading_head:
            self._linger()
        else:
            self.transport.close()

    def _start_body_clock(self) -> None:
        clock = self._reading.body
        clock.started_s = clock.last_byte_s = self.loop.time()
        clock.num_bytes = 0
        self._set_deadline(self.timeouts.body_timeout_s, self._on_body_timeout)

    def _set_deadline(self, delay_s: float, on_deadline: Callable[[], None]) -> None:
        self._deadline = self.loop.time() + delay_s
        self._on_deadline = on_deadline
        if self._read_timer is None:
            self._arm(self._deadline)
        elif self._timer_due > self._deadline:  # sooner than any clock: the linger
            self._read_timer.cancel()
            self._arm(self._deadline)

    def _arm(self, deadline: float) -> None:
        """The lazy timer, due no later than ``deadline`` and ``min(timeouts)`` from now."""
        period_s = min(self.timeouts.header_timeout_s, self.timeouts.body_timeout_s)
        self._timer_due = min(deadline, self.loop.time() + period_s)
        self._read_timer = self.loop.call_at(self._timer_due, self._check_deadline)

    def _check_deadline(self) -> None:
        self._read_timer = None
        if self._deadline is None:
            return  # no clock runs: the next one arms the timer again
        if self.loop.time() < self._deadline:
            self._arm(self._deadline)
            return
        self._deadline = None
        if self._on_deadline is not None:
            self._on_deadline()

    def _is_owed_answer(self) -> bool:
        """No answer is under way, so one may be written now."""
        return self.cycle is None or self.cycle.response_complete

    def _on_header_timeout(self) -> None:
        if self.is_done or self.transport.is_closing():
            return
        # Nothing sent yet (an idle pre-opened connection): close quietly, as proxies do.
        limit_s = self.timeouts.header_timeout_s
        message = f"request head not received within {limit_s:g} s"
        is_owed = self._reading.is_reading_head and self._is_owed_answer()
        self._refuse(RequestTimeout(message) if is_owed else None)

    def _on_body_timeout(self) -> None:
        if self.is_done or self.transport.is_closing():
            return
        # Not the client's fault: we stopped reading (the app is behind) or owe it a 100.
        if self.flow.read_paused or self.cycle.waiting_for_100_continue:
            self._start_body_clock()
            return
        timeouts, clock = self.timeouts, self._reading.body
        if self.loop.time() >= clock.last_byte_s + timeouts.body_timeout_s:
            message = f"request body stalled for more than {timeouts.body_timeout_s:g} s"
        else:
            rate = timeouts.body_min_bytes_per_s
            message = f"request body arrived slower than {rate:g} bytes/s (body_min_bytes_per_s)"
        self._refuse(None if self.cycle.response_started else RequestTimeout(message))

    def _refuse_head(self, why: str) -> None:
        limits = self.head_limits
        message = (
            f"the request head is {why} (max_header_bytes {limits.max_header_bytes}, "
            f"max_headers {limits.max_headers})"
        )
        self._refuse(HeadersTooLarge(message) if self._is_owed_answer() else None)

    def _refuse(self, error: ConveyorError | None) -> None:
        """Answer ``error`` (None: nothing is owed), then close; the app (if running) sees
        a disconnect. After an answer the close lingers, so that the client reads it."""
        if self.is_done:
            return
        # Debug only: a slow-loris attack would otherwise write a log line per connection.
        log.debug("closing the connection from %s: %s", self.client, error)
        if self.cycle is not None and not self.cycle.response_complete:
            # Whatever the app sends now must not follow our answer onto the wire.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if error is None:
            self.is_done = True
            if self.budget is not None:
                self.budget.close(self)
            self.transport.close()
            return
        self.transport.write(error_bytes(error))
        self._linger()

    def _linger(self) -> None:
        """Serve no more: FIN after the answer, then read and drop what still comes, up to
        ``linger``'s bounds, so the client's kernel has no cause to reset the connection."""
        self.is_done = self._is_lingering = True
        if self.budget is not None:
            self.budget.close(self)
        self._unset_keepalive_if_required()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self._set_deadline(self.linger.seconds, self.transport.close)

    def _drop(self, num_bytes: int) -> None:
        """Bytes after the last answer: read, counted and forgotten."""
        self._lingered_bytes += num_bytes
        if self._lingered_bytes > self.linger.max_bytes:
            self.transport.close()


def slow_client_protocol(
    timeouts: ReadTimeouts,
    head_limits: HeadLimits | None = None,
    *,
    max_connections: int | None = None,
    linger: Linger | None = None,
) -> type[SlowClientProtocol]:
    """A ``SlowClientProtocol`` class with these limits (and, with ``max_connections``, a
    budget of its own: one per server), to pass as uvicorn's ``http``."""
    settings: dict[str, Any] = {"timeouts": timeouts, "head_limits": head_limits or HeadLimits()}
    settings["linger"] = linger or Linger()
    if max_connections is not None:
        settings["budget"] = ConnectionBudget[SlowClientProtocol](max_connections)
    return type("ConfiguredSlowClientProtocol", (SlowClientProtocol,), settings)
