"""The result cache: identical deterministic requests are computed once.

Keys are content addresses: a hash of the tenant, the endpoint, the model and the canonical
request body (keys sorted), so re-running an evaluation set costs nothing for lines already
computed. The tenant is part of the key: one tenant never receives an answer computed for
another. Only deterministic requests are cached: embeddings always, generation only with
temperature 0. Values are the JSON response bodies, stored in the job store
(`cache_get_many` / `cache_put_many`). A cached generation answer is served with a fresh `id` and
`created`, as a new completion would be.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from conveyor.jobs.store import AsyncJobStore
from conveyor.openai_paths import EMBEDDINGS, GENERATION_ENDPOINTS

KEY_PREFIX = "v2:"  # v2: the tenant is part of the key (v1 keys are never read again)


def is_deterministic(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether the same body always yields the same response."""
    if endpoint == EMBEDDINGS:
        return True
    if endpoint in GENERATION_ENDPOINTS:
        # Sampling is random unless greedy; n > 1 asks for different answers on purpose.
        temperature = body.get("temperature")
        is_greedy = isinstance(temperature, int | float) and float(temperature) == 0.0
        return is_greedy and body.get("n", 1) == 1 and not body.get("stream", False)
    return False


def cache_key(tenant: str, endpoint: str, body: dict[str, Any]) -> str | None:
    """The content address of a tenant's request, or None when it must not be cached."""
    if not is_deterministic(endpoint, body):
        return None
    try:
        canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    digest = hashlib.sha256()
    for part in (
        tenant.encode(),
        endpoint.encode(),
        str(body.get("model", "")).encode(),
        canonical,
    ):
        digest.update(len(part).to_bytes(8, "little"))  # length-prefixed: no ambiguous joins
        digest.update(part)
    return KEY_PREFIX + digest.hexdigest()


def fresh_answer(endpoint: str, cached: bytes) -> bytes:
    """A cached response body as a new answer: generation gets a new ``id`` and ``created``."""
    if endpoint not in GENERATION_ENDPOINTS:
        return cached
    body = orjson.loads(cached)
    if isinstance(body.get("id"), str):
        prefix = body["id"].split("-", 1)[0]
        body["id"] = f"{prefix}-{uuid.uuid4().hex}"
    if "created" in body:
        body["created"] = int(time.time())
    return orjson.dumps(body)


class ResultCache:
    """Batched reads and writes of cached response bodies: one store round trip per batch."""

    def __init__(self, store: AsyncJobStore) -> None:
        """Use `store`'s result cache table."""
        self._store = store

    async def get_many(self, keys: Sequence[str | None]) -> list[bytes | None]:
        """The cached body for each key (None for a miss or an uncacheable request)."""
        wanted = sorted({key for key in keys if key is not None})
        found = await self._store.cache_get_many(wanted) if wanted else {}
        return [None if key is None else found.get(key) for key in keys]

    async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None:
        """Store response bodies under their keys (existing entries are left alone)."""
        if entries:
            await self._store.cache_put_many(dict(entries))
