"""New API keys and their stored form (only a SHA-256 digest and a short display prefix), and
the key a request presents."""

from __future__ import annotations

import hashlib
import secrets
import time

from conveyor.stores.tenant_records import ApiKeyRecord

KEY_PREFIX = "sk-cv-"
KEY_RANDOM_BYTES = 32
KEY_ID_PREFIX = "key_"
# Characters of the key shown by `keys list`: the fixed prefix plus a few random ones.
DISPLAY_PREFIX_CHARS = len(KEY_PREFIX) + 4


def digest_hex(key: str | bytes) -> str:
    """The SHA-256 of a key, in hex: what the store holds and requests are checked against."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()


def new_key() -> str:
    """A fresh key: `sk-cv-` and 32 random bytes, URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def new_key_record(
    tenant: str, *, is_admin: bool = False, now: float | None = None
) -> tuple[str, ApiKeyRecord]:
    """A new key and the record to store for it (which cannot give the key back)."""
    if not tenant:
        raise ValueError("tenant must be a non-empty string")
    key = new_key()
    record = ApiKeyRecord(
        id=KEY_ID_PREFIX + secrets.token_hex(8),
        tenant=tenant,
        digest=digest_hex(key),
        prefix=key[:DISPLAY_PREFIX_CHARS],
        created_at=int(time.time() if now is None else now),
        is_admin=is_admin,
    )
    return key, record


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
