"""Optional API keys: a pure ASGI middleware (cheaper than a per-route dependency)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.api.errors import error_response
from conveyor.config import ApiKey
from conveyor.errors import AuthenticationFailed

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/dashboard"})
# The dashboard page's scripts and styles hold no data (its state is under /v1).
OPEN_PREFIX = "/dashboard/"
METRICS_PATH = "/metrics"


def bearer_token(header: bytes) -> bytes | None:
    """The credentials of an ``Authorization: Bearer`` header, or None for another scheme.

    The scheme is case-insensitive (RFC 9110 section 11.1); spaces around the parts are
    tolerated.
    """
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    token = token.strip()
    return token or None


class ApiKeyMiddleware:
    """With keys configured, a missing or wrong ``Authorization: Bearer`` gets 401.

    The caller's tenant is put in ``scope["state"]["tenant"]``; without keys
    everyone is tenant ``default``. Only SHA-256 digests of the keys are held: a
    presented key is hashed and looked up by digest, so the lookup's timing can at most
    reveal digest bytes, which bring no one closer to a key.
    """

    def __init__(
        self, app: ASGIApp, api_keys: Sequence[ApiKey], *, is_metrics_open: bool = True
    ) -> None:
        self.app = app
        self.tenants = {api_key.digest: api_key.tenant for api_key in api_keys}
        self.open_paths = OPEN_PATHS if is_metrics_open else OPEN_PATHS - {METRICS_PATH}

    def tenant_for(self, header: bytes | None) -> str | None:
        """The tenant whose key the ``Authorization`` header carries, if any."""
        token = bearer_token(header) if header is not None else None
        if token is None:
            return None
        return self.tenants.get(hashlib.sha256(token).digest())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        path = scope["path"]
        if not self.tenants or path in self.open_paths or path.startswith(OPEN_PREFIX):
            state["tenant"] = "default"
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        tenant = self.tenant_for(header)
        if tenant is None:
            message = "missing API key" if header is None else "incorrect API key provided"
            response = error_response(AuthenticationFailed(message))
            await response(scope, receive, send)
            return
        state["tenant"] = tenant
        await self.app(scope, receive, send)
