"""Row types for the tenant aggregates of the job store: API keys and the usage ledger.

Plain frozen dataclasses, like `records`, so they cross threads and processes freely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Columns of `api_keys` in the order `ApiKeyRecord.from_row` reads them.
API_KEY_COLUMNS = "id, tenant, digest, prefix, is_admin, created_at, last_used_at, revoked_at"


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """A stored API key: only the SHA-256 of the key (hex) and its first characters."""

    id: str
    tenant: str
    digest: str
    prefix: str
    created_at: int
    is_admin: bool = False
    last_used_at: int | None = None
    revoked_at: int | None = None

    @property
    def is_revoked(self) -> bool:
        """Whether the key has been revoked (it is refused from then on)."""
        return self.revoked_at is not None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ApiKeyRecord:
        """Build from a row holding `API_KEY_COLUMNS`."""
        key_id, tenant, digest, prefix, is_admin, created_at, last_used_at, revoked_at = row
        return cls(
            id=key_id,
            tenant=tenant,
            digest=digest,
            prefix=prefix,
            created_at=int(created_at),
            is_admin=bool(is_admin),
            last_used_at=None if last_used_at is None else int(last_used_at),
            revoked_at=None if revoked_at is None else int(revoked_at),
        )
