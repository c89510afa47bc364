"""The limits a connection is held to, and the answers the server protocol gives itself
(in OpenAI's error shape) when one is broken. The protocol that applies them is
`api.slow_clients`."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from conveyor.asgi.json import error_response
from conveyor.errors import ConveyorError, RequestTimeout, TooManyConnections


@dataclass(frozen=True, slots=True)
class ReadTimeouts:
    """How long a client may take to send a request head, and to send its body."""

    header_timeout_s: float
    body_timeout_s: float
    # The slowest average a body may arrive at once its grace (body_timeout_s) is spent;
    # 0: no minimum, only silences are bounded.
    body_min_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        """Timeouts must be positive, the rate not negative."""
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s and body_timeout_s must be > 0")
        if self.body_min_bytes_per_s < 0:
            raise ValueError("body_min_bytes_per_s must be >= 0")

    def body_deadline(self, started_s: float, num_bytes: int, last_byte_s: float) -> float:
        """When a body begun at ``started_s``, with ``num_bytes`` in by ``last_byte_s``,
        is too slow: a silence of ``body_timeout_s``, or behind the minimum rate."""
        silence = last_byte_s + self.body_timeout_s
        if not self.body_min_bytes_per_s:
            return silence
        return min(silence, started_s + self.body_timeout_s + num_bytes / self.body_min_bytes_per_s)


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """The largest request head (request line and fields, in bytes) and the most fields.

    nginx allows 32 KiB by default (4 buffers of 8 KiB), Node.js 16 KiB, Go 1 MiB;
    Apache and gunicorn allow 100 fields.
    """

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100


@dataclass(frozen=True, slots=True)
class Linger:
    """How long and how much a connection closed after an early answer keeps reading.

    nginx lingers up to 30 s (``lingering_time``); a client that is still sending after
    5 s, or 64 MiB past its answer, is cut off.
    """

    seconds: float = 5.0
    max_bytes: int = 64 * 1024 * 1024


def error_bytes(error: ConveyorError) -> bytes:
    """A complete response for ``error`` in OpenAI's error shape that closes the connection."""
    body = orjson.dumps(error.to_body())
    extra = b"".join(
        b"%s: %s\r\n" % (name.lower().encode(), value.encode())
        for name, value in error.headers().items()
        if name.lower() != "connection"
    )
    head = b"content-type: application/json\r\ncontent-length: %d\r\n%sconnection: close\r\n\r\n"
    return STATUS_LINE[error.status_code] + head % (len(body), extra) + body


def timeout_response(message: str) -> bytes:
    """A complete 408 response in OpenAI's error shape that closes the connection."""
    return error_bytes(RequestTimeout(message))


def too_many_connections() -> TooManyConnections:
    """The 503 of a request that finds no place, or of a connection that made way."""
    return TooManyConnections(
        "the server is at its connection limit (max_connections); retry on a new connection"
    )


async def answer_at_capacity(scope: Scope, receive: Receive, send: Send) -> None:
    """The app a request runs when every place is held by a request in progress."""
    await error_response(too_many_connections())(scope, receive, send)
