"""In-memory API keys: the `ApiKeyStore` contract in a dictionary."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from conveyor.fakes.shards import MemoryBase, op
from conveyor.stores.errors import StoreError
from conveyor.stores.tenant_records import ApiKeyRecord


class MemoryApiKeys(MemoryBase):
    """API key records by id, in insertion order."""

    @op
    def create_api_key(self, rec: ApiKeyRecord) -> None:
        """Insert a key record; a repeated id or digest is refused."""
        if any(k.id == rec.id or k.digest == rec.digest for k in self._api_keys.values()):
            raise StoreError(f"api key {rec.id} or its digest exists")
        self._api_keys[rec.id] = rec

    @op
    def list_api_keys(self, *, include_revoked: bool = True) -> list[ApiKeyRecord]:
        """The keys oldest first (revoked ones only with `include_revoked`)."""
        return [k for k in self._api_keys.values() if include_revoked or not k.is_revoked]

    @op
    def revoke_api_key(self, key_id: str, now: float) -> bool:
        """Stamp the key revoked; False when unknown or already revoked."""
        rec = self._api_keys.get(key_id)
        if rec is None or rec.is_revoked:
            return False
        self._api_keys[key_id] = dataclasses.replace(rec, revoked_at=int(now))
        return True

    @op
    def touch_api_keys(self, key_ids: Sequence[str], now: float) -> None:
        """Record use at `now`; a later stamp stays."""
        for key_id in key_ids:
            rec = self._api_keys.get(key_id)
            if rec is not None and (rec.last_used_at is None or rec.last_used_at < int(now)):
                self._api_keys[key_id] = dataclasses.replace(rec, last_used_at=int(now))
