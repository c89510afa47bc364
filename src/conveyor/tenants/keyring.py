"""Which keys are accepted now: the config's keys plus the job store's, reread every few s.

A key revoked in the store is refused once the next reread lands (every `refresh_s`, 2 s by
default, so well within 5 s on every process). While the store cannot be read the last
keys read stay in force; before the first read succeeds, a process with a key store answers
503 rather than guessing. Use is counted in memory and written back on each reread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from conveyor.stores.protocols import ApiKeyStore
from conveyor.stores.tenant_records import ApiKeyRecord

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 2.0


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: its tenant, whether it may see every tenant, its key's id."""

    tenant: str
    is_admin: bool = False
    key_id: str | None = None


ANONYMOUS = Principal("default")


def stored_principals(records: Iterable[ApiKeyRecord]) -> dict[bytes, Principal]:
    """The accepted keys among `records` (revoked ones left out), by raw SHA-256 digest."""
    return {
        bytes.fromhex(rec.digest): Principal(rec.tenant, rec.is_admin, rec.id)
        for rec in records
        if not rec.is_revoked
    }


class KeyRing:
    """Keys from the config (fixed) and from an `ApiKeyStore` (reread in the background)."""

    def __init__(
        self,
        static: Mapping[bytes, Principal],
        store: ApiKeyStore | None = None,
        *,
        refresh_s: float = DEFAULT_REFRESH_S,
        owns_store: bool = False,
        requires_keys: bool = False,
    ) -> None:
        """Accept the `static` keys and those in `store` (closed at `stop` if `owns_store`);
        with `requires_keys` (a fleet worker with the fleet key), never let a keyless caller in."""
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
        self._static = dict(static)
        self._store = store
        self._owns_store = owns_store
        self._requires_keys = requires_keys
        self.refresh_s = refresh_s
        self._stored: dict[bytes, Principal] = {}
        self._has_stored_keys = False
        self.is_loaded = store is None
        self._used: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @property
    def is_enforced(self) -> bool:
        """Whether requests need a key: any key configured or ever created in the store, or
        a fleet key (whose holders say who the caller is)."""
        return self._requires_keys or bool(self._static) or self._has_stored_keys

    def lookup(self, digest: bytes) -> Principal | None:
        """The principal whose key has this SHA-256 digest, if it is accepted now."""
        principal = self._static.get(digest) or self._stored.get(digest)
        if principal is not None and principal.key_id is not None:
            self._used.add(principal.key_id)
        return principal

    def apply(self, records: list[ApiKeyRecord]) -> None:
        """Replace the stored keys with `records` (all of them, revoked included)."""
        self._stored = stored_principals(records)
        self._has_stored_keys = bool(records)
        self.is_loaded = True

    def load(self) -> None:
        """Blocking: read every key from the store once (a failure is logged, not raised)."""
        if self._store is None:
            return
        try:
            self.apply(self._store.list_api_keys())
        except Exception:  # the refresh loop retries; until then requests get 503
            log.warning("could not read API keys from the job store", exc_info=True)

    async def refresh(self) -> None:
        """Write back which keys were used, then reread every key from the store."""
        if self._store is None:
            return
        used, self._used = sorted(self._used), set()
        try:
            await asyncio.to_thread(self._store.touch_api_keys, used, time.time())
        except Exception:
            self._used.update(used)
            raise
        self.apply(await asyncio.to_thread(self._store.list_api_keys))

    async def start(self) -> None:
        """Keep rereading the store every `refresh_s` until `stop`."""
        if self._store is None:
            return
        self._task = asyncio.create_task(self._loop(), name="key-ring-refresh")

    async def stop(self) -> None:
        """Stop rereading and close the store."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._owns_store and self._store is not None:
            await asyncio.to_thread(self._store.close)

    async def _loop(self) -> None:
        """Reread until stopped; a failed reread keeps the last keys and is logged."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.refresh_s)
            if not self._stop.is_set():
                await self._refresh_logged()

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except Exception:  # loop boundary: the next round retries
            log.warning("could not reread API keys; keeping the last ones", exc_info=True)
