"""Forward one online request to a worker, retrying elsewhere until bytes reach the client.

What a worker is sent: the client's bytes, its headers less hop-by-hop ones and any only
the fleet may say (``worker_headers``), the target as the client wrote it, and the
request's prefix and session hint for the router (``affinity_hint``).

A failure before any byte of the response left the gateway (connection refused or reset,
worker died, worker answered 503) is retried on another worker, within the request's
deadline and an attempt limit. Once an event stream has started, a failure ends it with an
error event instead: the client already holds part of an answer.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from conveyor.errors import DeadlineExceeded, ServiceUnavailable
from conveyor.fleet.affinity import Affinity
from conveyor.fleet.credential import VOUCHED_HEADERS, FleetCredential, vouch_headers
from conveyor.fleet.drain import DRAINING_HEADER
from conveyor.fleet.router import Router, WorkerView
from conveyor.fleet.upstream_connection import UpstreamError, UpstreamTimeout
from conveyor.observability.context import note_model
from conveyor.observability.metrics import GatewayMetrics
from conveyor.observability.tracing import child_span, outbound_headers
from conveyor.tenants.keyring import ANONYMOUS, Principal

if TYPE_CHECKING:
    from conveyor.gateway.process import Gateway

log = logging.getLogger(__name__)

TIMEOUT_HEADER = b"x-conveyor-timeout-ms"
# Hop-by-hop and framing headers: each leg of the trip sets its own.
# ``expect``: the gateway has the whole body before it forwards, so a worker has nothing to
# let continue (its interim 100 answer would only be one more answer on the connection).
DROPPED_REQUEST_HEADERS = frozenset(
    {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te",
     b"upgrade", b"proxy-authorization", b"proxy-connection", b"expect", TIMEOUT_HEADER,
     # Set again per attempt: the request id (the caller's or ours) and the trace context.
     b"x-request-id", b"traceparent", b"tracestate"}
)  # fmt: skip
DROPPED_RESPONSE_HEADERS = frozenset(
    {b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"}
)
# Never passed on from a client: hop-by-hop headers and what only the fleet may say...
_NOT_FORWARDED = DROPPED_REQUEST_HEADERS | VOUCHED_HEADERS
# ...and, when the gateway calls workers with the fleet key, the client's own key (in either
# header a key may come in).
_NOT_FORWARDED_WITH_FLEET_KEY = _NOT_FORWARDED | {b"authorization", b"x-api-key"}
EVENT_STREAM = b"text/event-stream"
# Below this much time left an attempt cannot do useful work.
MIN_ATTEMPT_S = 0.005
# The worker is told to finish this much before the gateway's own deadline (at most a tenth
# of the time left): its answer still has to travel back and be relayed. Without it, a
# worker that admits an input it predicts to finish just in time answers after the gateway
# has given up, and the caller gets a 504 for work that was done.
RETURN_TRIP_RESERVE_S = 0.05


def worker_timeout_ms(remaining_s: float) -> float:
    """The time the worker is given, in ms: ``remaining_s`` less the return trip's reserve."""
    return max(0.0, remaining_s - min(RETURN_TRIP_RESERVE_S, remaining_s / 10)) * 1000


Headers = Sequence[tuple[bytes, bytes]]


class UpstreamAnswer(Protocol):
    """A worker's answer as the proxy reads it (``upstream.UpstreamResponse`` is one)."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), or None."""

    async def read(self) -> bytes:
        """The whole body; releases the connection."""

    def chunks(self, idle_timeout_s: float) -> AsyncIterator[bytes]:
        """The body as it arrives."""

    def release(self) -> None:
        """Done with the answer (idempotent)."""


class Upstream(Protocol):
    """Sends a request to a worker (``upstream.UpstreamPool`` is one)."""

    async def request(
        self,
        address: str,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
        deadline: float,
    ) -> UpstreamAnswer:
        """The worker's status and headers; raises ``upstream.UpstreamError`` subclasses."""


class FailureReason(enum.StrEnum):
    """Why an attempt was given up and retried elsewhere."""

    TRANSPORT = "transport"  # refused, reset, died mid-answer
    UNAVAILABLE = "unavailable"  # the worker answered 503 (draining, loading)


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """Retry limits and connection timeouts."""

    max_attempts: int = 3
    connect_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        """Validate the knobs."""
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {self.connect_timeout_s}")


@dataclass(frozen=True, slots=True)
class OutboundRequest:
    """What the client sent, ready to replay on any worker (the body is never re-encoded)."""

    method: str
    path: str
    headers: Headers
    body: bytes
    model: str
    deadline: float  # on the event loop's clock
    affinity: Affinity | None = None  # where its prefix or session would run best
    regions: frozenset[str] | None = None  # a resident tenant's: no worker elsewhere


@dataclass(frozen=True, slots=True)
class ProxiedResponse:
    """A worker's whole answer, passed on as it came: an ASGI app that sends it."""

    status_code: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), or None."""
        return next((value for key, value in self.headers if key == name), None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send status, headers and body as two ASGI messages."""
        headers = [*self.headers, (b"content-length", b"%d" % len(self.body))]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


class _AttemptFailed(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def forwardable_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones (those ``Connection`` names too) and our
    own deadline header."""
    dropped = DROPPED_REQUEST_HEADERS
    for name, value in headers:
        if name.lower() == b"connection":  # rare: most clients send no Connection header
            named = {token.strip().lower() for token in value.split(b",")}
            dropped = dropped | named
    return [(k, v) for k, v in headers if k.lower() not in dropped]


def response_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The worker's response headers worth passing on."""
    return [(k, v) for k, v in headers if k not in DROPPED_RESPONSE_HEADERS]


def stream_error_event(message: str) -> bytes:
    """An SSE event in OpenAI's error shape, ending a stream that broke half-way."""
    error = {"message": message, "type": "server_error", "param": None, "code": "worker_failed"}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


def request_target(scope: Scope) -> str:
    """The request target as the client sent it (still percent-encoded), with its query."""
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    query: bytes = scope.get("query_string", b"")
    return (raw_path + b"?" + query if query else raw_path).decode("latin-1")


def principal_of(scope: Scope) -> Principal:
    """Who the key middleware (always in front) found the caller to be."""
    principal = scope.get("state", {}).get("principal", ANONYMOUS)
    return principal if isinstance(principal, Principal) else ANONYMOUS


def worker_headers(scope: Scope, credential: FleetCredential | None) -> list[tuple[bytes, bytes]]:
    """The headers a worker gets: the client's, less hop-by-hop ones and any a client may not
    send (``X-Conveyor-Tenant``); with the fleet key, that key instead of the client's and
    the caller the gateway authenticated."""
    if credential is None:
        return [(k, v) for k, v in scope["headers"] if k.lower() not in _NOT_FORWARDED]
    dropped = _NOT_FORWARDED_WITH_FLEET_KEY
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in dropped]
    principal = principal_of(scope)
    headers.append((b"authorization", credential.authorization))
    headers.extend(vouch_headers(principal.tenant, principal.is_admin))
    return headers


async def affinity_hint(gateway: Gateway, scope: Scope, body: bytes, model: str) -> Affinity | None:
    """The request's prefix and session hint, when the gateway routes by affinity."""
    if gateway.router.affinity is None:
        return None
    sizes = {h.block_size for v in gateway.registry.views if (h := v.prefixes.get(model))}
    return await gateway.hints.read(scope["path"], scope["headers"], body, model, sizes)


class Proxy:
    """Sends requests to workers the router picks; owns retries, ejection and streaming."""

    def __init__(
        self,
        upstream: Upstream,
        router: Router,
        workers: Callable[[], Sequence[WorkerView]],
        settings: ProxySettings,
        metrics: GatewayMetrics,
        *,
        wall_clock: Callable[[], float],
    ) -> None:
        self._upstream = upstream
        self._router = router
        self._workers = workers
        self.settings = settings
        self._metrics = metrics
        self._wall_clock = wall_clock

    async def forward(self, request: OutboundRequest) -> ProxiedResponse | StreamingResponse:
        """The first answer a worker gives that is not a failure; 503 or 504 otherwise."""
        note_model(request.model)
        with child_span("conveyor.gateway.route", **{"conveyor.model": request.model}):
            return await self._route(request)

    async def _route(self, request: OutboundRequest) -> ProxiedResponse | StreamingResponse:
        """Try workers the router picks, within the attempt limit and the deadline."""
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        last_failure = "no healthy worker hosts it"
        for _ in range(self.settings.max_attempts):
            remaining_s = request.deadline - loop.time()
            if remaining_s < MIN_ATTEMPT_S:
                raise DeadlineExceeded("the deadline passed before any worker answered")
            worker = self._router.choose(
                self._workers(), request.model, self._wall_clock(), exclude=tried,
                affinity=request.affinity, regions=request.regions,
            )  # fmt: skip
            if worker is None:
                break
            tried.add(worker.worker_id)
            try:
                attempt = {"conveyor.worker": worker.worker_id}
                with child_span("conveyor.gateway.attempt", **attempt):
                    return await self._attempt(worker, request, remaining_s)
            except _AttemptFailed as failure:
                last_failure = f"worker {worker.worker_id}: {failure}"
                self._metrics.retries.labels(request.model, failure.reason.value).inc()
                log.info("attempt on %s failed (%s); retrying", worker.worker_id, failure)
        if loop.time() >= request.deadline:
            raise DeadlineExceeded("the deadline passed before any worker answered")
        raise ServiceUnavailable(
            f"no worker could serve model {request.model!r} ({last_failure})", code="no_worker"
        )

    async def _attempt(
        self, worker: WorkerView, request: OutboundRequest, remaining_s: float
    ) -> ProxiedResponse | StreamingResponse:
        """One try on ``worker``; raises ``_AttemptFailed`` when another worker may succeed."""
        self._router.acquire(worker.worker_id)
        is_handed_over = False
        try:
            answer = await self._send(worker, request, remaining_s)
            if answer.status == 503:
                if answer.header(DRAINING_HEADER):
                    self._router.drained.mark(worker.worker_id, self._wall_clock())
                answer.release()
                raise _AttemptFailed(FailureReason.UNAVAILABLE, "answered 503")
            if (answer.header(b"content-type") or b"").startswith(EVENT_STREAM):
                is_handed_over = True
                return self._relay_stream(worker, answer, remaining_s)
            try:
                body = await answer.read()
            except UpstreamTimeout:
                raise DeadlineExceeded("the worker did not answer within the deadline") from None
            except UpstreamError as exc:
                self._router.ejections.eject(worker.worker_id, self._wall_clock())
                raise _AttemptFailed(FailureReason.TRANSPORT, repr(exc)) from None
            return ProxiedResponse(answer.status, response_headers(answer.headers), body)
        finally:
            if not is_handed_over:
                self._router.release(worker.worker_id)

    async def _send(
        self, worker: WorkerView, request: OutboundRequest, remaining_s: float
    ) -> UpstreamAnswer:
        """Send the request and read the status line and headers (body still streaming)."""
        trip = [(name.encode(), value.encode()) for name, value in outbound_headers()]
        timeout = (TIMEOUT_HEADER, b"%.0f" % worker_timeout_ms(remaining_s))
        headers = [*request.headers, timeout, *trip]
        try:
            return await self._upstream.request(
                worker.address, request.method, request.path, headers, request.body,
                request.deadline,
            )  # fmt: skip
        except UpstreamTimeout:
            raise DeadlineExceeded("the worker did not answer within the deadline") from None
        except UpstreamError as exc:
            # Refused, reset or closed before any byte reached the caller: retry elsewhere.
            self._router.ejections.eject(worker.worker_id, self._wall_clock())
            raise _AttemptFailed(FailureReason.TRANSPORT, repr(exc)) from None

    def _relay_stream(
        self, worker: WorkerView, answer: UpstreamAnswer, idle_timeout_s: float
    ) -> StreamingResponse:
        """Pass an event stream through chunk by chunk; a broken stream ends with an error."""

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.chunks(idle_timeout_s):
                    yield chunk
            except UpstreamError as exc:
                log.warning("stream from %s broke: %r", worker.worker_id, exc)
                yield stream_error_event(
                    f"the worker serving this stream failed ({type(exc).__name__}); "
                    "the response is incomplete"
                )
            finally:
                answer.release()
                self._router.release(worker.worker_id)

        headers = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in response_headers(answer.headers)
        }
        return StreamingResponse(
            relay(), status_code=answer.status, headers=headers, media_type="text/event-stream"
        )
