"""Stored responses (OpenAI's Responses API): the row type and its statuses.

A stored response holds its Response object and its input items as JSON text, so a later
turn (``previous_response_id``), ``GET`` and the input item list read one row. A
background response also holds its runnable request (``job``) until it ends, and the
lease of the worker running it, fenced by ``attempt`` as a shard's is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["RESPONSE_COLUMNS", "TERMINAL_RESPONSE_STATUSES", "ResponseStatus", "StoredResponse"]


class ResponseStatus(StrEnum):
    """A response's status, spelled as OpenAI spells it."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INCOMPLETE = "incomplete"


TERMINAL_RESPONSE_STATUSES = frozenset(
    {
        ResponseStatus.COMPLETED,
        ResponseStatus.FAILED,
        ResponseStatus.CANCELLED,
        ResponseStatus.INCOMPLETE,
    }
)

# The stored columns, in the order rows hold them.
RESPONSE_COLUMNS = (
    "id, tenant, model, status, created_at, body, input_items, job, attempt, lease_owner, "
    "lease_expires_at"
)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response; ``body`` and ``input_items`` are JSON text.

    The row's ``status`` is the response's: ``body``'s own status field is overwritten
    by it when the response is shown (a claim or a cancel changes only the column).
    """

    id: str
    tenant: str
    model: str
    status: ResponseStatus
    created_at: int
    body: str
    input_items: str
    job: str | None = None
    attempt: int = 0
    lease_owner: str | None = None
    lease_expires_at: float | None = None

    def __post_init__(self) -> None:
        """Reject records that could never be valid rows."""
        if not self.id or not self.tenant or not self.model:
            raise ValueError("a stored response needs an id, a tenant and a model")
        if self.attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {self.attempt}")

    @property
    def is_terminal(self) -> bool:
        """Whether the response has ended (it runs no more)."""
        return self.status in TERMINAL_RESPONSE_STATUSES

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> StoredResponse:
        """Build from a row holding ``RESPONSE_COLUMNS`` in order."""
        (response_id, tenant, model, status, created_at, body, items, job, attempt, owner,
         expires_at) = row  # fmt: skip
        return cls(
            id=response_id, tenant=tenant, model=model, status=ResponseStatus(status),
            created_at=int(created_at), body=body, input_items=items, job=job,
            attempt=int(attempt), lease_owner=owner,
            lease_expires_at=None if expires_at is None else float(expires_at),
        )  # fmt: skip
