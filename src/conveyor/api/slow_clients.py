"""Read timeouts for slow clients (slow-loris): uvicorn's httptools protocol plus two clocks.

uvicorn bounds only the idle time between keep-alive requests; a client that trickles
its request head or body holds a connection (and a place under the connection cap)
for as long as it likes. Like nginx's ``client_header_timeout`` and
``client_body_timeout``, this protocol closes a connection that has not delivered a
whole request head within ``header_timeout_s`` of connecting (or of the first byte
of a later request), or whose body goes ``body_timeout_s`` without a byte. It
answers 408 first when the client is owed no other response.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from conveyor.api.disconnect import DISCONNECT_HOOK, DisconnectHook
from conveyor.errors import RequestTimeout

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadTimeouts:
    """How long a client may take to send a request head, and to send each body chunk."""

    header_timeout_s: float
    body_timeout_s: float

    def __post_init__(self) -> None:
        """Both must be positive."""
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s and body_timeout_s must be > 0")


def timeout_response(message: str) -> bytes:
    """A complete 408 response in OpenAI's error shape that closes the connection."""
    body = orjson.dumps(RequestTimeout(message).to_body())
    head = (
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n\r\n" % len(body)
    )
    return STATUS_LINE[408] + head + body


class SlowClientProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header and a body read timeout.

    Use ``slow_client_protocol(timeouts)``, which sets ``timeouts`` on a subclass:
    uvicorn builds protocols from a class and its own config only.

    The clocks are deadlines, not timers: a request moves a float, and one lazy timer per
    connection checks the deadline when it fires (at most ``min(timeouts)`` apart, so it is
    never late for a deadline set after it was armed), re-arming only while a clock runs.
    """

    timeouts = ReadTimeouts(header_timeout_s=10.0, body_timeout_s=30.0)
    _read_timer: asyncio.TimerHandle | None = None
    _deadline: float | None = None
    _on_deadline: Callable[[], None] | None = None
    _is_reading_head = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start the clock for the first request head at connect time."""
        super().connection_made(transport)  # type: ignore[arg-type]
        # The disconnect hooks of requests not yet answered, oldest first.
        self._hooks: deque[DisconnectHook] = deque()
        self._set_deadline(self.timeouts.header_timeout_s, self._on_header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        """No timer outlives its connection."""
        self._deadline = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        super().connection_lost(exc)
        while self._hooks:
            self._hooks.popleft().fire()

    def on_message_begin(self) -> None:
        """A later request's first byte starts its own header clock."""
        super().on_message_begin()
        self._is_reading_head = True
        if self._deadline is None:
            self._set_deadline(self.timeouts.header_timeout_s, self._on_header_timeout)

    def on_headers_complete(self) -> None:
        """The head is in: from now on the body must keep moving. The request's scope gets
        a `DisconnectHook`, so a handler learns of a lost connection without a task."""
        self._is_reading_head = False
        self._set_deadline(self.timeouts.body_timeout_s, self._on_body_timeout)
        hook = DisconnectHook()
        scope = cast(dict[str, Any], self.scope)  # uvicorn types extensions narrowly
        scope["extensions"] = {**scope.get("extensions", {}), DISCONNECT_HOOK: hook}
        self._hooks.append(hook)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        """Answers go out in request order: the oldest request's hook retires."""
        if self._hooks:
            self._hooks.popleft()
        super().on_response_complete()

    def on_body(self, body: bytes) -> None:
        """Each chunk of body restarts the body clock."""
        self._deadline = self.loop.time() + self.timeouts.body_timeout_s
        super().on_body(body)

    def on_message_complete(self) -> None:
        """The whole request is in: nothing more to wait for from the client."""
        self._deadline = None
        super().on_message_complete()

    def _set_deadline(self, delay_s: float, on_deadline: Callable[[], None]) -> None:
        self._deadline = self.loop.time() + delay_s
        self._on_deadline = on_deadline
        if self._read_timer is None:
            self._arm(self._deadline)

    def _arm(self, deadline: float) -> None:
        """The lazy timer, due no later than ``deadline`` and ``min(timeouts)`` from now."""
        period_s = min(self.timeouts.header_timeout_s, self.timeouts.body_timeout_s)
        due = min(deadline, self.loop.time() + period_s)
        self._read_timer = self.loop.call_at(due, self._check_deadline)

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

    def _on_header_timeout(self) -> None:
        if self.transport.is_closing():
            return
        # Nothing sent yet (an idle pre-opened connection): close quietly, as proxies do.
        is_owed_408 = self._is_reading_head and (self.cycle is None or self.cycle.response_complete)
        limit_s = self.timeouts.header_timeout_s
        self._close(f"request head not received within {limit_s:g} s", is_owed_408)

    def _on_body_timeout(self) -> None:
        if self.transport.is_closing():
            return
        # Not the client's fault: we stopped reading (the app is behind) or owe it a 100.
        if self.flow.read_paused or self.cycle.waiting_for_100_continue:
            self._set_deadline(self.timeouts.body_timeout_s, self._on_body_timeout)
            return
        limit_s = self.timeouts.body_timeout_s
        message = f"request body stalled for more than {limit_s:g} s"
        self._close(message, not self.cycle.response_started)

    def _close(self, message: str, is_owed_408: bool) -> None:
        """Answer 408 when owed, then close; the app (if running) sees a disconnect."""
        # Debug only: a slow-loris attack would otherwise write a log line per connection.
        log.debug("closing a slow connection from %s: %s", self.client, message)
        if is_owed_408:
            self.transport.write(timeout_response(message))
        if self.cycle is not None and not self.cycle.response_complete:
            # Whatever the app sends now must not follow the 408 onto the wire.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()


def slow_client_protocol(timeouts: ReadTimeouts) -> type[SlowClientProtocol]:
    """A ``SlowClientProtocol`` class with ``timeouts``, to pass as uvicorn's ``http``."""
    return type("ConfiguredSlowClientProtocol", (SlowClientProtocol,), {"timeouts": timeouts})
