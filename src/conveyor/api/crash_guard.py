"""The outermost ASGI layer: a crash ends one response, never the keep-alive connection.

Starlette's ``ServerErrorMiddleware`` answers an unhandled exception (through our
``on_crash`` handler, which logs it) and then re-raises it "so servers can log it".
uvicorn, seeing an exception leave the app, closes the transport even though a
complete response went out without ``Connection: close``: a client's next request on
that pooled connection fails. This guard sits outside Starlette and swallows the
exception once the response is complete, so uvicorn keeps the connection.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.errors import error_response
from conveyor.errors import ConveyorError

log = logging.getLogger(__name__)


class CrashGuard:
    """Wrap ``app`` so an exception after a complete response does not drop the connection.

    An exception before any response is answered here with an OpenAI-shaped 500 (and
    logged); one in the middle of a response is re-raised, since only closing the
    connection can tell the client the body is cut short.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_started = False
        is_complete = False

        async def tracking_send(message: Message) -> None:
            nonlocal is_started, is_complete
            if message["type"] == "http.response.start":
                is_started = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                is_complete = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if is_complete:
                return  # answered (and logged) by the app's own crash handler
            if is_started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await error_response(ConveyorError("internal server error"))(scope, receive, send)
