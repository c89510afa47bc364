"""Optional API keys: a pure ASGI middleware (cheaper than a per-route dependency)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.api.errors import error_response
from conveyor.errors import AuthenticationFailed

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ApiKeyMiddleware:
    """With keys configured, a missing or wrong ``Authorization: Bearer`` gets 401.

    The caller's tenant is put in ``scope["state"]["tenant"]``; without keys
    everyone is tenant ``default``.
    """

    def __init__(self, app: ASGIApp, keys: dict[str, str]) -> None:
        self.app = app
        self.keys = {f"Bearer {key}".encode(): tenant for key, tenant in keys.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if not self.keys or scope["path"] in OPEN_PATHS:
            state["tenant"] = "default"
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        tenant = self.keys.get(header) if header is not None else None
        if tenant is None:
            message = "missing API key" if header is None else "incorrect API key provided"
            response = error_response(AuthenticationFailed(message))
            await response(scope, receive, send)
            return
        state["tenant"] = tenant
        await self.app(scope, receive, send)
