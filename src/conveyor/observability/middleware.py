"""The outermost middleware: a request id on every answer, a server span, one log line.

Every response carries ``x-request-id`` (the caller's own when acceptable, else a fresh one),
401s and 413s included. Requests under ``/v1/`` get a server span when tracing is on, and a
log line with the request's id, tenant, model, endpoint, status and timings.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.observability.context import (
    REQUEST_ID_HEADER,
    RequestContext,
    accept_request_id,
    request_scope,
)
from conveyor.observability.tracing import server_span

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

request_log = logging.getLogger("conveyor.requests")

WORK_PREFIX = "/v1/"
# Polled every couple of seconds by open dashboards: not worth a line each.
QUIET_PATHS = frozenset({"/v1/dashboard/state"})
_HEADER_KEY = REQUEST_ID_HEADER.encode()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def request_fields(context: RequestContext, status: int, total_s: float) -> dict[str, Any]:
    """The fields of a request's log line."""
    return {
        "event": "request",
        "request_id": context.request_id,
        "tenant": context.tenant,
        "model": context.model,
        "endpoint": context.endpoint,
        "status": status,
        "queue_wait_ms": _ms(context.queue_wait_s),
        "batch_size": context.batch_size,
        "model_ms": _ms(context.model_s),
        "total_ms": _ms(total_s),
    }


class RequestObserver:
    """Tags each HTTP request with an id, traces and logs it."""

    def __init__(
        self, app: ASGIApp, *, tracer: Tracer | None = None, log_level: int = logging.INFO
    ) -> None:
        self.app = app
        self.tracer = tracer
        self.log_level = log_level

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == _HEADER_KEY), None)
        path: str = scope["path"]
        is_work = path.startswith(WORK_PREFIX) and path not in QUIET_PATHS
        context = RequestContext(accept_request_id(header), path)
        if is_work:
            context.tracer = self.tracer
        id_header = (_HEADER_KEY, context.request_id.encode())
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != _HEADER_KEY]
                message["headers"] = [*kept, id_header]
                if context.span is not None:
                    context.span.set_attribute("http.response.status_code", status)
            await send(message)

        started_s = time.perf_counter()
        try:
            with request_scope(context):
                await self._serve(context, scope, receive, send_with_id)
        finally:
            context.tenant = scope.get("state", {}).get("tenant")
            level = self.log_level if is_work else logging.DEBUG
            if request_log.isEnabledFor(level):
                fields = request_fields(context, status, time.perf_counter() - started_s)
                request_log.log(
                    level, "%s %s %d", scope["method"], path, status, extra={"fields": fields}
                )

    async def _serve(
        self, context: RequestContext, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run the app, inside a server span when the request is traced."""
        if context.tracer is None:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"],
                      "conveyor.request_id": context.request_id}  # fmt: skip
        name = f"{scope['method']} {scope['path']}"
        with server_span(context.tracer, name, headers, attributes) as span:
            context.span = span
            await self.app(scope, receive, send)
            if context.model is not None:
                span.set_attribute("conveyor.model", context.model)
