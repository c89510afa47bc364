"""A cap on request bodies, enforced before any handler reads them.

A declared ``Content-Length`` above the cap is refused at once, unread. A body sent
without a length (chunked) is counted as it arrives and refused when it crosses the cap.
File uploads stream to storage under their own limit, so their paths are exempt.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.asgi.json import error_response
from conveyor.errors import RequestTooLarge

# Uploads stream to the object store and are bounded by the jobs' own ``max_file_bytes``; a
# Message Batch's inline requests are bounded by their route (256 MB, as Anthropic's).
UPLOAD_PATHS = frozenset({"/v1/files", "/v1/messages/batches"})


class BodyLimitMiddleware:
    """413 in OpenAI's shape for a body over ``max_bytes`` (exempt paths excepted)."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, exempt_paths: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt_paths = exempt_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt_paths:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.max_bytes:
                await error_response(self._too_large(declared))(scope, receive, send)
                return
            # The server never delivers more than the declared length: nothing to count.
            await self.app(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        """``receive`` that raises ``RequestTooLarge`` once the body crosses the cap."""
        num_bytes = 0

        async def counted() -> Message:
            nonlocal num_bytes
            message = await receive()
            if message["type"] == "http.request":
                num_bytes += len(message.get("body", b""))
                if num_bytes > self.max_bytes:
                    raise self._too_large(None)
            return message

        return counted

    def _too_large(self, declared: int | None) -> RequestTooLarge:
        size = "" if declared is None else f" ({declared} bytes)"
        return RequestTooLarge(
            f"the request body{size} is larger than this server accepts "
            f"({self.max_bytes} bytes; max_request_bytes)"
        )


def _content_length(scope: Scope) -> int | None:
    """The declared body length, or None when absent or unreadable."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
