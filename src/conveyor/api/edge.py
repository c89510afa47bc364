"""The outermost layer of every Conveyor app: one ``send`` wrapper where there were three.

``Edge`` does in one pass what a crash guard, an HTTP-metrics middleware and a request
observer did as three stacked layers, each wrapping ``send``:

- every response carries ``x-request-id`` (the caller's own when acceptable, else a
  fresh one); ``/v1/`` requests get a server span when tracing is on and a log line;
- every HTTP request is counted by method, route template and status, refusals included;
- an exception after a complete response is swallowed, so uvicorn keeps the keep-alive
  connection; one before any response is answered with an OpenAI-shaped 500 (and
  logged); one in the middle of a response is re-raised, since only closing the
  connection can tell the client the body is cut short.

``EdgeApp`` puts the edge (and the guards behind it: CORS, API keys, the body cap, budgets,
rate limits) *outside* FastAPI's own middleware stack, and ``Dispatch`` at the end of
the guards sends the hot routes straight to their handler, past FastAPI's error
middleware, routing and request machinery; everything else goes on to the full app.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.errors import answered_error
from conveyor.asgi.json import error_response
from conveyor.errors import ConveyorError
from conveyor.observability.context import (
    REQUEST_ID_HEADER,
    RequestContext,
    accept_request_id,
    enter_request,
    leave_request,
)
from conveyor.observability.middleware import QUIET_PATHS, WORK_PREFIX, request_fields, request_log
from conveyor.observability.tracing import server_span

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

UNMATCHED_ROUTE = "unmatched"
_ID_KEY = REQUEST_ID_HEADER.encode()

# The ASGI app to run for a request past the guards, or None for the full app.
Shortcut = Callable[[Scope], ASGIApp | None]


def route_label(scope: Scope) -> str:
    """The template of the route that handled the request, or ``unmatched``."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else UNMATCHED_ROUTE


class Edge:
    """Request id, log line and span, the HTTP request counter and the crash guard."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        counter: Any,
        tracer: Tracer | None = None,
        log_level: int = logging.INFO,
        on_request: Callable[[Scope, RequestContext], None] | None = None,
    ) -> None:
        """`on_request` sees each HTTP request's scope and context as it starts (it may set
        the context's `response_headers` and `on_finish` hooks): `serve`'s rate limits."""
        self.app = app
        self.counter = counter
        self.tracer = tracer
        self.log_level = log_level
        self.on_request = on_request
        # The counter's children by labels: a dict lookup instead of ``labels()`` (a lock and
        # a label check) per request. Bounded: methods, route templates and statuses.
        self._counted: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope["headers"]:
            if name == _ID_KEY:
                header = value
                break
        path: str = scope["path"]
        is_work = path.startswith(WORK_PREFIX) and path not in QUIET_PATHS
        context = RequestContext(accept_request_id(header), path)
        if is_work:
            context.tracer = self.tracer
        if self.on_request is not None:
            self.on_request(scope, context)
        id_header = (_ID_KEY, context.request_id.encode())
        status = 500  # what a client sees when the app fails before answering
        is_started = is_complete = False

        async def edge_send(message: Message) -> None:
            nonlocal status, is_started, is_complete
            if message["type"] == "http.response.start":
                is_started = True
                status = message["status"]
                headers = message.get("headers", [])
                if any(k.lower() == _ID_KEY for k, _ in headers):
                    headers = [(k, v) for k, v in headers if k.lower() != _ID_KEY]
                message["headers"] = [*headers, id_header]
                if context.response_headers is not None:
                    message["headers"] += context.response_headers()
                if context.span is not None:
                    context.span.set_attribute("http.response.status_code", status)
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                is_complete = True
            await send(message)

        started_s = time.perf_counter()
        token = enter_request(context)
        try:
            await self._serve(context, scope, receive, edge_send)
        except Exception:
            if is_started and not is_complete:
                raise
            if not is_started:
                log.exception("unhandled error on %s %s", scope["method"], path)
                await error_response(ConveyorError("internal server error"))(
                    scope, receive, edge_send
                )
            # Else answered (and logged) by the app's own crash handler: the connection stays.
        finally:
            if context.on_finish is not None:
                context.on_finish()
            leave_request(token)
            self._count(scope["method"], route_label(scope), status)
            self._log(context, scope, status, time.perf_counter() - started_s, is_work)

    def _count(self, method: str, route: str, status: int) -> None:
        """One more request with these labels."""
        key = (method, route, status)
        child = self._counted.get(key)
        if child is None:
            child = self._counted[key] = self.counter.labels(method, route, str(status))
        child.inc()

    def _log(
        self, context: RequestContext, scope: Scope, status: int, total_s: float, is_work: bool
    ) -> None:
        """The request's log line (at debug level outside ``/v1/``)."""
        level = self.log_level if is_work else logging.DEBUG
        if request_log.isEnabledFor(level):
            context.tenant = scope.get("state", {}).get("tenant")
            fields = request_fields(context, status, total_s)
            request_log.log(
                level, "%s %s %d", scope["method"], scope["path"], status, extra={"fields": fields}
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


class Dispatch:
    """The end of the guards: a shortcut's app when it names one, else the full app."""

    def __init__(self, app: ASGIApp, shortcut: Shortcut | None) -> None:
        self.app = app
        self.shortcut = shortcut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = None
        if self.shortcut is not None and scope["type"] == "http":
            direct = self.shortcut(scope)
        await (direct or self.app)(scope, receive, send)


class DirectRoute:
    """A ``Request -> Response`` route run without FastAPI's per-request machinery.

    Handled exceptions are answered with the same mapping as the app's exception
    handlers; anything else reaches the edge's crash guard.
    """

    def __init__(self, route: Route) -> None:
        self.route = route
        self.endpoint: Callable[[Request], Any] = route.endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self.route  # the metrics' route label
        try:
            response: Response = await self.endpoint(Request(scope, receive, send))
        except Exception as exc:
            answer = answered_error(exc)
            if answer is None:
                raise
            response = answer
        await response(scope, receive, send)


def direct_routes(app: FastAPI, paths: frozenset[str]) -> Shortcut:
    """A shortcut to the app's own routes at ``paths``, for the methods they accept."""
    routes = {
        route.path: DirectRoute(route)
        for route in app.routes
        if isinstance(route, Route) and route.path in paths
    }

    def shortcut(scope: Scope) -> ASGIApp | None:
        direct = routes.get(scope["path"])
        if direct is None or scope["method"] not in (direct.route.methods or ()):
            return None
        return direct

    return shortcut


class EdgeApp(FastAPI):
    """A FastAPI app whose outermost layers (``edge``) run before FastAPI's own stack.

    ``edge`` takes the full app (FastAPI's middleware and routes) and returns what runs
    first; without it the app is a plain FastAPI app.
    """

    edge: Callable[[ASGIApp], ASGIApp] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """HTTP requests go straight to the edge: what FastAPI's and Starlette's ``__call__``
        add per request (the telemetry checks, which Conveyor turns off) is skipped."""
        if self.edge is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self.root_path:
            scope["root_path"] = self.root_path
        scope["app"] = self
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self.middleware_stack(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        """FastAPI's stack, inside the edge."""
        full = super().build_middleware_stack()
        return full if self.edge is None else self.edge(full)
