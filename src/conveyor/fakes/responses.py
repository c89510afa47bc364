"""In-memory stored responses: the `ResponseStore` contract in a dictionary."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from conveyor.fakes.shards import MemoryBase, op
from conveyor.stores.errors import StoreError
from conveyor.stores.response_records import ResponseStatus, StoredResponse
from conveyor.stores.tenant_records import UsageRow

_ACTIVE = (ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS)


class MemoryResponses(MemoryBase):
    """Responses by id, with the SQL store's claims, fences and usage."""

    def __init__(self) -> None:
        """An empty store."""
        super().__init__()
        # id -> (insertion order, row)
        self._responses: dict[str, tuple[int, StoredResponse]] = {}

    @op
    def create_response(self, rec: StoredResponse) -> None:
        """Insert a response; a second one with its id is refused."""
        if rec.id in self._responses:
            raise StoreError(f"response {rec.id} exists")
        self._responses[rec.id] = (next(self._seq), rec)

    @op
    def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's response, or None."""
        _, rec = self._responses.get(response_id, (0, None))
        return rec if rec is not None and rec.tenant == tenant else None

    @op
    def delete_response(self, tenant: str, response_id: str) -> bool:
        """Delete the tenant's response; whether it existed."""
        if self.get_response(tenant, response_id) is None:
            return False
        del self._responses[response_id]
        return True

    @op
    def claimable_responses(self, now: float, limit: int) -> list[tuple[str, str]]:
        """Runnable background responses, oldest first."""
        rows = sorted(self._responses.values(), key=lambda pair: pair[0])
        found = [(r.id, r.model) for _, r in rows if _is_claimable(r, now)]
        return found[:limit]

    @op
    def claim_response(
        self, response_id: str, worker_id: str, now: float, lease_s: float
    ) -> StoredResponse | None:
        """Lease a claimable response; the claimed row, or None."""
        seq, rec = self._responses.get(response_id, (0, None))
        if rec is None or not _is_claimable(rec, now):
            return None
        claimed = dataclasses.replace(
            rec, status=ResponseStatus.IN_PROGRESS, attempt=rec.attempt + 1,
            lease_owner=worker_id, lease_expires_at=float(now + lease_s),
        )  # fmt: skip
        self._responses[response_id] = (seq, claimed)
        return claimed

    @op
    def renew_response(self, rec: StoredResponse, now: float, lease_s: float) -> bool:
        """Extend the lease while the attempt holds the run."""
        return self._update_held(rec, lease_expires_at=float(now + lease_s))

    @op
    def finish_response(
        self, rec: StoredResponse, status: ResponseStatus, body: str, usage: Sequence[UsageRow] = ()
    ) -> bool:
        """End the run, with its usage, while the attempt holds it."""
        is_held = self._update_held(
            rec, status=ResponseStatus(status), body=body, job=None, lease_owner=None,
            lease_expires_at=None,
        )  # fmt: skip
        if is_held:
            self._fold_usage(usage)
        return is_held

    @op
    def release_response(self, rec: StoredResponse) -> bool:
        """Give the run back while the attempt holds it."""
        return self._update_held(
            rec, status=ResponseStatus.QUEUED, lease_owner=None, lease_expires_at=None
        )

    @op
    def cancel_response(self, tenant: str, response_id: str, body: str) -> bool:
        """Cancel the tenant's queued or running response."""
        rec = self.get_response(tenant, response_id)
        if rec is None or rec.status not in _ACTIVE:
            return False
        seq = self._responses[response_id][0]
        self._responses[response_id] = (seq, dataclasses.replace(
            rec, status=ResponseStatus.CANCELLED, body=body, job=None, lease_owner=None,
            lease_expires_at=None,
        ))  # fmt: skip
        return True

    def _update_held(self, rec: StoredResponse, **changes: object) -> bool:
        """Apply ``changes`` if the row is still held by ``rec``'s attempt (lock held)."""
        seq, current = self._responses.get(rec.id, (0, None))
        if current is None or not _is_held(current, rec):
            return False
        self._responses[rec.id] = (seq, dataclasses.replace(current, **changes))  # type: ignore[arg-type]
        return True


def _is_claimable(rec: StoredResponse, now: float) -> bool:
    """Queued, or running under an expired lease (and not yet ended)."""
    if rec.job is None:
        return False
    if rec.status is ResponseStatus.QUEUED:
        return True
    expires_at = rec.lease_expires_at
    return rec.status is ResponseStatus.IN_PROGRESS and (expires_at is None or expires_at <= now)


def _is_held(current: StoredResponse, rec: StoredResponse) -> bool:
    """Whether ``rec``'s attempt still holds the run ``current`` is."""
    return (
        current.status is ResponseStatus.IN_PROGRESS
        and current.attempt == rec.attempt
        and current.lease_owner == rec.lease_owner
    )
