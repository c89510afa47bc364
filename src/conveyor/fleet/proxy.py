"""Forward one online request to a worker, retrying elsewhere until bytes reach the client.

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

import httpx
import orjson
from starlette.responses import Response, StreamingResponse

from conveyor.errors import DeadlineExceeded, ServiceUnavailable
from conveyor.fleet.router import Router, WorkerView
from conveyor.metrics import GatewayMetrics
from conveyor.observability.context import note_model
from conveyor.observability.tracing import child_span, outbound_headers

log = logging.getLogger(__name__)

TIMEOUT_HEADER = "x-conveyor-timeout-ms"
# Hop-by-hop and framing headers: each leg of the trip sets its own.
DROPPED_REQUEST_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te",
     "upgrade", "proxy-authorization", "proxy-connection", TIMEOUT_HEADER,
     # Set again per attempt: the request id (the caller's or ours) and the trace context.
     "x-request-id", "traceparent", "tracestate"}
)  # fmt: skip
DROPPED_RESPONSE_HEADERS = frozenset(
    {"content-length", "connection", "keep-alive", "transfer-encoding", "date", "server"}
)
EVENT_STREAM = "text/event-stream"
# Below this much time left an attempt cannot do useful work.
MIN_ATTEMPT_S = 0.005


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
    """What the client sent, ready to replay on any worker."""

    method: str
    path: str
    headers: Sequence[tuple[str, str]]
    body: bytes
    model: str
    deadline: float  # on the event loop's clock


class _AttemptFailed(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def forwardable_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop ones and our own deadline header."""
    return [(k, v) for k, v in headers if k.lower() not in DROPPED_REQUEST_HEADERS]


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    """The worker's response headers worth passing on."""
    return {k: v for k, v in headers.items() if k.lower() not in DROPPED_RESPONSE_HEADERS}


def stream_error_event(message: str) -> bytes:
    """An SSE event in OpenAI's error shape, ending a stream that broke half-way."""
    error = {"message": message, "type": "server_error", "param": None, "code": "worker_failed"}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


class Proxy:
    """Sends requests to workers the router picks; owns retries, ejection and streaming."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        router: Router,
        workers: Callable[[], Sequence[WorkerView]],
        settings: ProxySettings,
        metrics: GatewayMetrics,
        *,
        wall_clock: Callable[[], float],
    ) -> None:
        self._client = client
        self._router = router
        self._workers = workers
        self.settings = settings
        self._metrics = metrics
        self._wall_clock = wall_clock

    async def forward(self, request: OutboundRequest) -> Response:
        """The first answer a worker gives that is not a failure; 503 or 504 otherwise."""
        note_model(request.model)
        with child_span("conveyor.gateway.route", **{"conveyor.model": request.model}):
            return await self._route(request)

    async def _route(self, request: OutboundRequest) -> Response:
        """Try workers the router picks, within the attempt limit and the deadline."""
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        last_failure = "no healthy worker hosts it"
        for _ in range(self.settings.max_attempts):
            remaining_s = request.deadline - loop.time()
            if remaining_s < MIN_ATTEMPT_S:
                raise DeadlineExceeded("the deadline passed before any worker answered")
            worker = self._router.choose(
                self._workers(), request.model, self._wall_clock(), exclude=tried
            )
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
    ) -> Response:
        """One try on ``worker``; raises ``_AttemptFailed`` when another worker may succeed."""
        self._router.acquire(worker.worker_id)
        is_handed_over = False
        try:
            upstream = await self._send(worker, request, remaining_s)
            if upstream.status_code == 503:
                await upstream.aclose()
                raise _AttemptFailed(FailureReason.UNAVAILABLE, "answered 503")
            if upstream.headers.get("content-type", "").startswith(EVENT_STREAM):
                is_handed_over = True
                return self._relay_stream(worker, upstream)
            try:
                body = await upstream.aread()
            except httpx.TimeoutException:
                raise DeadlineExceeded("the worker did not answer within the deadline") from None
            except (httpx.TransportError, AttributeError, OSError) as exc:  # see _send
                self._router.ejections.eject(worker.worker_id, self._wall_clock())
                raise _AttemptFailed(FailureReason.TRANSPORT, repr(exc)) from None
            headers = response_headers(upstream.headers)
            return Response(body, status_code=upstream.status_code, headers=headers)
        finally:
            if not is_handed_over:
                self._router.release(worker.worker_id)

    async def _send(
        self, worker: WorkerView, request: OutboundRequest, remaining_s: float
    ) -> httpx.Response:
        """Send the request and read the status line and headers (body still streaming)."""
        timeout = httpx.Timeout(
            remaining_s, connect=min(remaining_s, self.settings.connect_timeout_s)
        )
        trip = [(TIMEOUT_HEADER, f"{remaining_s * 1000:.0f}"), *outbound_headers()]
        headers = [*request.headers, *trip]
        outbound = self._client.build_request(
            request.method,
            worker.address + request.path,
            headers=headers,
            content=request.body,
            timeout=timeout,
        )
        try:
            return await self._client.send(outbound, stream=True)
        except httpx.ConnectTimeout as exc:
            self._router.ejections.eject(worker.worker_id, self._wall_clock())
            raise _AttemptFailed(FailureReason.TRANSPORT, repr(exc)) from None
        except httpx.TimeoutException:
            raise DeadlineExceeded("the worker did not answer within the deadline") from None
        except httpx.TransportError as exc:
            self._router.ejections.eject(worker.worker_id, self._wall_clock())
            raise _AttemptFailed(FailureReason.TRANSPORT, repr(exc)) from None
        except (AttributeError, OSError) as exc:
            # The client stack can fail this way on a socket the dying worker just closed
            # (seen: httpcore asking a closed anyio socket for its peer). Nothing reached
            # the caller yet, so this is a transport failure: retry elsewhere.
            self._router.ejections.eject(worker.worker_id, self._wall_clock())
            raise _AttemptFailed(FailureReason.TRANSPORT, repr(exc)) from None

    def _relay_stream(self, worker: WorkerView, upstream: httpx.Response) -> StreamingResponse:
        """Pass an event stream through chunk by chunk; a broken stream ends with an error."""

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError as exc:
                log.warning("stream from %s broke: %r", worker.worker_id, exc)
                yield stream_error_event(
                    f"the worker serving this stream failed ({type(exc).__name__}); "
                    "the response is incomplete"
                )
            finally:
                await upstream.aclose()
                self._router.release(worker.worker_id)

        return StreamingResponse(
            relay(),
            status_code=upstream.status_code,
            headers=response_headers(upstream.headers),
            media_type=EVENT_STREAM,
        )
