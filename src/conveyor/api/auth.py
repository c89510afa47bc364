"""Optional API keys: a pure ASGI middleware (cheaper than a per-route dependency)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.asgi.json import error_response
from conveyor.config.settings import ApiKey
from conveyor.errors import AuthenticationFailed, ServiceUnavailable
from conveyor.fleet.credential import FleetCredential, vouched_principal
from conveyor.tenants.keyring import ANONYMOUS, KeyRing, Principal
from conveyor.tenants.keys import bearer_token

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/dashboard"})
# Anthropic's clients send the key in its own header (`x-api-key`) instead of a bearer token.
API_KEY_HEADER = b"x-api-key"
# The dashboard page's scripts and styles hold no data (its state is under /v1).
OPEN_PREFIX = "/dashboard/"
METRICS_PATH = "/metrics"


def static_principals(api_keys: Sequence[ApiKey]) -> dict[bytes, Principal]:
    """The config's keys by SHA-256 digest."""
    return {key.digest: Principal(key.tenant, key.admin) for key in api_keys}


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, bool]:
    """The key a request presents, and whether it sent a key header at all.

    ``Authorization: Bearer`` wins; without an ``Authorization`` header, ``x-api-key``
    (Anthropic's header) is read.
    """
    header = next((v for k, v in headers if k == b"authorization"), None)
    if header is not None:
        return bearer_token(header), True
    key = next((v for k, v in headers if k == API_KEY_HEADER), None)
    if key is None:
        return None, False
    return key.strip() or None, True


class ApiKeyMiddleware:
    """With keys configured or stored, a missing or wrong key gets 401: the key goes in
    ``Authorization: Bearer`` or in ``x-api-key``.

    The caller's tenant is put in ``scope["state"]["tenant"]`` (and the whole `Principal` in
    ``scope["state"]["principal"]``); without keys everyone is tenant ``default``. Only
    SHA-256 digests of the keys are held: a presented key is hashed and looked up by digest,
    so the lookup's timing can at most reveal digest bytes, which bring no one closer to a key.

    With a `fleet` credential (a fleet worker), the fleet key is accepted too, for the caller
    its gateway vouched for in ``X-Conveyor-Tenant`` (see ``fleet.credential``); a request
    with any other key is that key's tenant, whatever such a header says.
    """

    def __init__(
        self,
        app: ASGIApp,
        keyring: KeyRing,
        *,
        is_metrics_open: bool = True,
        fleet: FleetCredential | None = None,
    ) -> None:
        self.app = app
        self.keyring = keyring
        self.fleet = fleet
        self.open_paths = OPEN_PATHS if is_metrics_open else OPEN_PATHS - {METRICS_PATH}

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
        token, is_sent = presented_key(scope["headers"])
        digest = hashlib.sha256(token).digest() if token is not None else None
        if digest is not None and self.fleet is not None and self.fleet.matches_digest(digest):
            vouched = vouched_principal(scope["headers"])
            if vouched is None:
                return AuthenticationFailed("the fleet key needs one valid X-Conveyor-Tenant")
            return vouched
        if not self.keyring.is_loaded:
            return ServiceUnavailable("API keys are not loaded yet")
        principal = self.keyring.lookup(digest) if digest is not None else None
        if principal is None:
            message = "incorrect API key provided" if is_sent else "missing API key"
            return AuthenticationFailed(message)
        return principal
