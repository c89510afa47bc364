"""Counting every HTTP request by route template and status, refusals included.

Outermost middleware, so a 401 for a missing key, a 413, a 503 at the connection limit and
a 400 from body validation are all counted. The route is the matched template
(``/v1/batches/{batch_id}``), never the raw path, so ids do not multiply the series.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED_ROUTE = "unmatched"


def route_label(scope: Scope) -> str:
    """The template of the route that handled the request, or ``unmatched``."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED_ROUTE


class HttpMetricsMiddleware:
    """Increments ``counter{method, route, status}`` once per HTTP request."""

    def __init__(self, app: ASGIApp, counter: Any) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what a client sees when the app fails before answering

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.counter.labels(scope["method"], route_label(scope), str(status)).inc()
