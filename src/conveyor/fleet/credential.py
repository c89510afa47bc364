"""The fleet's internal credential: how a gateway vouches for its caller to a worker, and how
peers fetch chunks from each other.

A gateway authenticates the client with its own keys (the config's and the stored ones),
then calls the worker with ``Authorization: Bearer <fleet key>`` and the caller in
``X-Conveyor-Tenant`` (the tenant, percent-encoded UTF-8) and, for an admin key,
``X-Conveyor-Tenant-Admin: 1``. A worker believes those headers only beside a valid fleet
key: the gateway drops any a client sent, and a worker given its own key ignores them (the
key says who the caller is). Chunk servers want the same key from their peers.

The key is compared by its SHA-256 digest with `hmac.compare_digest`: constant time, and
no length to learn from the presented token. It never appears in a repr, a log or a metric.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable
from urllib.parse import quote, unquote

from conveyor.fleet.key_config import MIN_KEY_CHARS, FleetConfig
from conveyor.tenants.keyring import Principal

TENANT_HEADER = b"x-conveyor-tenant"
ADMIN_HEADER = b"x-conveyor-tenant-admin"
# What only a holder of the fleet key may say about a request.
VOUCHED_HEADERS = frozenset({TENANT_HEADER, ADMIN_HEADER})
_ADMIN = (ADMIN_HEADER, b"1")


class FleetCredential:
    """The fleet key: checks a presented token, and is what gateways and peers present."""

    __slots__ = ("_digest", "authorization")

    def __init__(self, secret: bytes) -> None:
        """Hold `secret` (at least `MIN_KEY_CHARS` bytes)."""
        if len(secret) < MIN_KEY_CHARS:
            raise ValueError(f"the fleet key must be at least {MIN_KEY_CHARS} bytes")
        self._digest = hashlib.sha256(secret).digest()
        # The ``Authorization`` value a gateway or a peer sends.
        self.authorization = b"Bearer " + secret

    def __repr__(self) -> str:
        return "FleetCredential(<hidden>)"

    def matches_digest(self, token_digest: bytes) -> bool:
        """Whether the token whose SHA-256 is `token_digest` is the fleet key."""
        return hmac.compare_digest(token_digest, self._digest)

    def matches(self, token: bytes) -> bool:
        """Whether `token` is the fleet key."""
        return self.matches_digest(hashlib.sha256(token).digest())


def credential_from(config: FleetConfig) -> FleetCredential | None:
    """The configured fleet credential, or None when the fleet has no internal key."""
    secret = config.secret
    return None if secret is None else FleetCredential(secret)


@functools.lru_cache(maxsize=4096)
def vouch_headers(tenant: str, is_admin: bool) -> tuple[tuple[bytes, bytes], ...]:
    """The headers that say who a gateway's caller is (cached: a fleet has few tenants)."""
    encoded = (TENANT_HEADER, quote(tenant, safe="").encode("ascii"))
    return (encoded, _ADMIN) if is_admin else (encoded,)


def vouched_principal(headers: Iterable[tuple[bytes, bytes]]) -> Principal | None:
    """The caller a gateway vouched for, or None when the tenant is missing, repeated or
    malformed. Only for a request that carried the fleet key."""
    tenants: list[bytes] = []
    is_admin = False
    for name, value in headers:  # ASGI servers give header names in lower case
        if name == TENANT_HEADER:
            tenants.append(value)
        elif name == ADMIN_HEADER:
            is_admin = value == b"1"
    if len(tenants) != 1:
        return None
    try:
        tenant = unquote(tenants[0].decode("ascii"), errors="strict")
    except UnicodeDecodeError:
        return None
    return Principal(tenant, is_admin) if tenant else None
