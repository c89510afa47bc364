"""Optional API keys: a pure ASGI middleware (cheaper than a per-route dependency)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.api.errors import error_response
from conveyor.config import ApiKey
from conveyor.errors import AuthenticationFailed, ServiceUnavailable
from conveyor.tenants.keyring import ANONYMOUS, KeyRing, Principal

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


def static_principals(api_keys: Sequence[ApiKey]) -> dict[bytes, Principal]:
    """The config's keys by SHA-256 digest."""
    return {key.digest: Principal(key.tenant, key.admin) for key in api_keys}


class ApiKeyMiddleware:
    """With keys configured or stored, a missing or wrong ``Authorization: Bearer`` gets 401.

    The caller's tenant is put in ``scope["state"]["tenant"]`` (and the whole `Principal` in
    ``scope["state"]["principal"]``); without keys everyone is tenant ``default``. Only
    SHA-256 digests of the keys are held: a presented key is hashed and looked up by digest,
    so the lookup's timing can at most reveal digest bytes, which bring no one closer to a key.
    """

    def __init__(self, app: ASGIApp, keyring: KeyRing, *, is_metrics_open: bool = True) -> None:
        self.app = app
        self.keyring = keyring
        self.open_paths = OPEN_PATHS if is_metrics_open else OPEN_PATHS - {METRICS_PATH}

    def principal_for(self, header: bytes | None) -> Principal | None:
        """The principal whose key the ``Authorization`` header carries, if any."""
        token = bearer_token(header) if header is not None else None
        if token is None:
            return None
        return self.keyring.lookup(hashlib.sha256(token).digest())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        path = scope["path"]
        if (
            path in self.open_paths
            or path.startswith(OPEN_PREFIX)
            or (self.keyring.is_loaded and not self.keyring.is_enforced)
        ):
            state["tenant"], state["principal"] = ANONYMOUS.tenant, ANONYMOUS
            await self.app(scope, receive, send)
            return
        principal = self._check(scope)
        if not isinstance(principal, Principal):
            await error_response(principal)(scope, receive, send)
            return
        state["tenant"], state["principal"] = principal.tenant, principal
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> Principal | AuthenticationFailed | ServiceUnavailable:
        """The request's principal, or the error to answer with."""
        if not self.keyring.is_loaded:
            return ServiceUnavailable("API keys are not loaded yet")
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        principal = self.principal_for(header)
        if principal is None:
            message = "missing API key" if header is None else "incorrect API key provided"
            return AuthenticationFailed(message)
        return principal
