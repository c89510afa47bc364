"""API keys over SQL: hashes only, read whole by each process's key ring."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.stores.sql_base import SqlStore
from conveyor.stores.sql_queries import shared
from conveyor.stores.tenant_records import API_KEY_COLUMNS, ApiKeyRecord

INSERT_API_KEY = shared(
    "insert_api_key",
    f"INSERT INTO api_keys ({API_KEY_COLUMNS}) VALUES (:id, :tenant, :digest, :prefix, "
    ":is_admin, :created_at, :last_used_at, :revoked_at)",
)

LIST_API_KEYS = shared(
    "list_api_keys",
    f"SELECT {API_KEY_COLUMNS} FROM api_keys "
    "WHERE (:include_revoked = 1 OR revoked_at IS NULL) ORDER BY seq",
)

REVOKE_API_KEY = shared(
    "revoke_api_key",
    "UPDATE api_keys SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL",
)

TOUCH_API_KEY = shared(
    "touch_api_key",
    "UPDATE api_keys SET last_used_at = :now "
    "WHERE id = :id AND (last_used_at IS NULL OR last_used_at < :now)",
)


class SqlApiKeyStore(SqlStore):
    """`ApiKeyStore` over SQL."""

    def create_api_key(self, rec: ApiKeyRecord) -> None:
        """Insert a key record; a repeated id or digest raises StoreError."""
        params = {
            "id": rec.id,
            "tenant": rec.tenant,
            "digest": rec.digest,
            "prefix": rec.prefix,
            "is_admin": int(rec.is_admin),
            "created_at": rec.created_at,
            "last_used_at": rec.last_used_at,
            "revoked_at": rec.revoked_at,
        }
        self._change(INSERT_API_KEY, params)

    def list_api_keys(self, *, include_revoked: bool = True) -> list[ApiKeyRecord]:
        """Return the keys oldest first (revoked ones only with `include_revoked`)."""
        rows = self._rows(LIST_API_KEYS, {"include_revoked": int(include_revoked)})
        return [ApiKeyRecord.from_row(row) for row in rows]

    def revoke_api_key(self, key_id: str, now: float) -> bool:
        """Stamp the key revoked; False when it is unknown or already revoked."""
        return self._change(REVOKE_API_KEY, {"id": key_id, "now": int(now)}) > 0

    def touch_api_keys(self, key_ids: Sequence[str], now: float) -> None:
        """Record that the keys were used at `now` (later stamps stay)."""
        if not key_ids:
            return
        rows = [{"id": key_id, "now": int(now)} for key_id in key_ids]
        with self._session(is_write=True) as session:
            session.execute_many(TOUCH_API_KEY.text(self._dialect), rows)
