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


# Columns of `usage_minutes` in the order `UsageRow.from_row` reads them.
USAGE_COLUMNS = (
    "tenant, model, minute_start, num_requests, input_tokens, output_tokens, model_s, cost_usd"
)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One tenant's use of one model during one minute (`minute_start`, unix seconds)."""

    tenant: str
    model: str
    minute_start: int
    num_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    model_s: float = 0.0
    cost_usd: float = 0.0

    def __post_init__(self) -> None:
        """Rows are whole minutes of non-negative use."""
        if self.minute_start % 60:
            raise ValueError(f"minute_start must be a whole minute, got {self.minute_start}")
        counts = (self.num_requests, self.input_tokens, self.output_tokens)
        if min(counts) < 0 or self.model_s < 0 or self.cost_usd < 0:
            raise ValueError(f"usage must be >= 0: {self}")

    @property
    def key(self) -> tuple[str, str, int]:
        """What rows are summed by: tenant, model, minute."""
        return (self.tenant, self.model, self.minute_start)

    def plus(self, other: UsageRow) -> UsageRow:
        """The sum of two rows of the same key."""
        if other.key != self.key:
            raise ValueError(f"cannot add usage of {other.key} to {self.key}")
        return UsageRow(
            self.tenant,
            self.model,
            self.minute_start,
            self.num_requests + other.num_requests,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.model_s + other.model_s,
            self.cost_usd + other.cost_usd,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> UsageRow:
        """Build from a row holding `USAGE_COLUMNS`."""
        tenant, model, minute, num, input_tokens, output_tokens, model_s, cost = row
        return cls(
            tenant, model, int(minute), int(num), int(input_tokens), int(output_tokens),
            float(model_s), float(cost),
        )  # fmt: skip
