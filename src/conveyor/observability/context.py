"""The request context: who a piece of work belongs to, carried in a context variable.

The HTTP middleware opens one per request (``request_scope``); batch lines open one per line
with the id ``{batch_id}:{custom_id}``. Work items capture the context when they are created,
so the batcher can report queue wait, batch size and model time back to the request's log line
and trace without knowing about HTTP.
"""

from __future__ import annotations

import contextvars
import random
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

REQUEST_ID_HEADER = "x-request-id"
# A caller's id is kept when it is short, visible ASCII; anything else gets a fresh id, so
# that an id can never smuggle a newline or a huge string into logs and headers.
_VALID_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


@dataclass(slots=True)
class RequestContext:
    """What is known about one request so far (filled in as it moves through Conveyor)."""

    request_id: str
    endpoint: str
    tenant: str | None = None
    model: str | None = None
    queue_wait_s: float | None = None
    batch_size: int | None = None
    model_s: float | None = None
    span: Span | None = None
    tracer: Tracer | None = None
    # More headers for the answer, worked out when it starts (the tenant rate limits').
    response_headers: Callable[[], Sequence[tuple[bytes, bytes]]] | None = None
    # Run by the edge when the request ends, answered or not (a rate-limit settlement).
    on_finish: Callable[[], None] | None = None

    def note_batch(self, queue_wait_s: float, batch_size: int) -> None:
        """One of the request's inputs started in a batch (the slowest input counts)."""
        self.queue_wait_s = max(queue_wait_s, self.queue_wait_s or 0.0)
        self.batch_size = max(batch_size, self.batch_size or 0)

    def note_model_time(self, model_s: float) -> None:
        """A batch holding one of the request's inputs finished after ``model_s``."""
        self.model_s = max(model_s, self.model_s or 0.0)


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "conveyor_request", default=None
)


def current_request() -> RequestContext | None:
    """The context of the request being served by this task, if any."""
    return _current.get()


def note_model(model: str) -> None:
    """Record the model the current request asked for (no-op outside a request)."""
    context = _current.get()
    if context is not None:
        context.model = model


RequestToken = contextvars.Token[RequestContext | None]


def enter_request(context: RequestContext) -> RequestToken:
    """Make ``context`` current (and for the tasks created meanwhile) until ``leave_request``.

    ``request_scope`` without a generator's cost, for the edge's per-request path.
    """
    return _current.set(context)


def leave_request(token: RequestToken) -> None:
    """Undo ``enter_request``."""
    _current.reset(token)


@contextmanager
def request_scope(context: RequestContext) -> Iterator[RequestContext]:
    """Make ``context`` current for the block (and the tasks it creates)."""
    token = enter_request(context)
    try:
        yield context
    finally:
        leave_request(token)


def new_request_id() -> str:
    """A fresh request id: 128 random bits as 32 hex digits.

    Python's generator, not ``uuid4``: no system call per request. The id correlates log
    lines and traces; it guards nothing. (``random`` reseeds itself in a forked child.)
    """
    return f"req-{random.getrandbits(128):032x}"


def accept_request_id(header: bytes | str | None) -> str:
    """The caller's id when it is acceptable, else a fresh one."""
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    if header is not None and _VALID_REQUEST_ID.match(header):
        return header
    return new_request_id()


def line_request_id(batch_id: str, custom_id: str) -> str:
    """The request id of a batch line: ``{batch_id}:{custom_id}``."""
    return f"{batch_id}:{custom_id}"
