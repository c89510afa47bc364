"""Stored responses over SQL: one row each, per tenant; background runs leased and fenced.

A background response is claimed by compare-and-set: queued, or in progress under a
lease that expired (its worker died), it moves to ``in_progress`` under the claimer's
lease with ``attempt`` one higher. Every later write of the run (renew, finish, release)
names that attempt, so a run that lost its lease changes nothing; a finish adds the
run's usage to the ledger in the same transaction, so usage is counted once.
"""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.stores.response_records import RESPONSE_COLUMNS, ResponseStatus, StoredResponse
from conveyor.stores.sql_base import SqlStore
from conveyor.stores.sql_queries import shared
from conveyor.stores.sql_usage import add_usage_rows
from conveyor.stores.tenant_records import UsageRow

_QUEUED = ResponseStatus.QUEUED.value
_RUNNING = ResponseStatus.IN_PROGRESS.value
# Runnable now: queued, or running under an expired lease.
_CLAIMABLE = (
    f"job IS NOT NULL AND (status = '{_QUEUED}' OR (status = '{_RUNNING}' "
    "AND (lease_expires_at IS NULL OR lease_expires_at <= :now)))"
)
# This attempt still holds the run.
_HELD = f"id = :id AND attempt = :attempt AND lease_owner = :owner AND status = '{_RUNNING}'"

INSERT_RESPONSE = shared(
    "insert_response",
    f"INSERT INTO responses ({RESPONSE_COLUMNS}) VALUES (:id, :tenant, :model, :status, "
    ":created_at, :body, :input_items, :job, :attempt, :lease_owner, :lease_expires_at)",
)
GET_RESPONSE = shared(
    "get_response",
    f"SELECT {RESPONSE_COLUMNS} FROM responses WHERE id = :id AND tenant = :tenant",
)
GET_RESPONSE_ANY = shared(
    "get_response_any", f"SELECT {RESPONSE_COLUMNS} FROM responses WHERE id = :id"
)
DELETE_RESPONSE = shared(
    "delete_response", "DELETE FROM responses WHERE id = :id AND tenant = :tenant"
)
CLAIMABLE_RESPONSES = shared(
    "claimable_responses",
    f"SELECT id, model FROM responses WHERE {_CLAIMABLE} ORDER BY seq LIMIT :limit",
)
CLAIM_RESPONSE = shared(
    "claim_response",
    f"UPDATE responses SET status = '{_RUNNING}', attempt = attempt + 1, "
    "lease_owner = :owner, lease_expires_at = :expires_at "
    f"WHERE id = :id AND {_CLAIMABLE}",
)
RENEW_RESPONSE = shared(
    "renew_response", f"UPDATE responses SET lease_expires_at = :expires_at WHERE {_HELD}"
)
FINISH_RESPONSE = shared(
    "finish_response",
    "UPDATE responses SET status = :status, body = :body, job = NULL, lease_owner = NULL, "
    f"lease_expires_at = NULL WHERE {_HELD}",
)
RELEASE_RESPONSE = shared(
    "release_response",
    f"UPDATE responses SET status = '{_QUEUED}', lease_owner = NULL, lease_expires_at = NULL "
    f"WHERE {_HELD}",
)
CANCEL_RESPONSE = shared(
    "cancel_response",
    "UPDATE responses SET status = :status, body = :body, job = NULL, lease_owner = NULL, "
    "lease_expires_at = NULL WHERE id = :id AND tenant = :tenant "
    f"AND status IN ('{_QUEUED}', '{_RUNNING}')",
)


class SqlResponseStore(SqlStore):
    """`ResponseStore` over SQL."""

    def create_response(self, rec: StoredResponse) -> None:
        """Insert a response; a second one with its id raises StoreError."""
        params = {
            "id": rec.id, "tenant": rec.tenant, "model": rec.model, "status": rec.status.value,
            "created_at": rec.created_at, "body": rec.body, "input_items": rec.input_items,
            "job": rec.job, "attempt": rec.attempt, "lease_owner": rec.lease_owner,
            "lease_expires_at": rec.lease_expires_at,
        }  # fmt: skip
        self._change(INSERT_RESPONSE, params)

    def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's response, or None (also for another tenant's)."""
        rows = self._rows(GET_RESPONSE, {"id": response_id, "tenant": tenant})
        return StoredResponse.from_row(rows[0]) if rows else None

    def delete_response(self, tenant: str, response_id: str) -> bool:
        """Delete the tenant's response; whether it existed."""
        return self._change(DELETE_RESPONSE, {"id": response_id, "tenant": tenant}) > 0

    def claimable_responses(self, now: float, limit: int) -> list[tuple[str, str]]:
        """Background responses runnable at ``now``, oldest first: (id, model) pairs."""
        rows = self._rows(CLAIMABLE_RESPONSES, {"now": float(now), "limit": limit})
        return [(str(response_id), str(model)) for response_id, model in rows]

    def claim_response(
        self, response_id: str, worker_id: str, now: float, lease_s: float
    ) -> StoredResponse | None:
        """Lease the response to ``worker_id`` if it is claimable; the claimed row, or None."""
        params = {
            "id": response_id, "owner": worker_id, "now": float(now),
            "expires_at": float(now + lease_s),
        }  # fmt: skip
        with self._session(is_write=True) as session:
            if session.execute(CLAIM_RESPONSE.text(self._dialect), params) == 0:
                return None
            rows = session.query(GET_RESPONSE_ANY.text(self._dialect), {"id": response_id})
        return StoredResponse.from_row(rows[0])

    def renew_response(self, rec: StoredResponse, now: float, lease_s: float) -> bool:
        """Extend the run's lease to ``now + lease_s``; False once the attempt lost it."""
        params = {**_held(rec), "expires_at": float(now + lease_s)}
        return self._change(RENEW_RESPONSE, params) > 0

    def finish_response(
        self, rec: StoredResponse, status: ResponseStatus, body: str, usage: Sequence[UsageRow] = ()
    ) -> bool:
        """End the run with ``status`` and ``body``, with its usage, if the attempt holds it."""
        params = {**_held(rec), "status": ResponseStatus(status).value, "body": body}
        with self._session(is_write=True) as session:
            if session.execute(FINISH_RESPONSE.text(self._dialect), params) == 0:
                return False
            add_usage_rows(session, self._dialect, usage)
        return True

    def release_response(self, rec: StoredResponse) -> bool:
        """Give the run back (queued) without finishing it, e.g. when shutting down."""
        return self._change(RELEASE_RESPONSE, _held(rec)) > 0

    def cancel_response(self, tenant: str, response_id: str, body: str) -> bool:
        """Cancel the tenant's queued or running response; False if it had ended or is gone."""
        params = {
            "id": response_id, "tenant": tenant, "body": body,
            "status": ResponseStatus.CANCELLED.value,
        }  # fmt: skip
        return self._change(CANCEL_RESPONSE, params) > 0


def _held(rec: StoredResponse) -> dict[str, object]:
    """The parameters naming a run's attempt."""
    return {"id": rec.id, "attempt": rec.attempt, "owner": rec.lease_owner}
