"""Stored responses, on every job store implementation (memory, SQLite, PostgreSQL): per
tenant, and background runs claimed, renewed, finished and released by attempt."""

from __future__ import annotations

import json

from conveyor.stores import JobStore
from conveyor.stores.response_records import ResponseStatus, StoredResponse
from conveyor.stores.tenant_records import UsageRow

LEASE_S = 10.0


def stored(response_id: str, *, tenant: str = "acme", job: str | None = None) -> StoredResponse:
    """A response row; with ``job`` a queued background response."""
    status = ResponseStatus.QUEUED if job is not None else ResponseStatus.COMPLETED
    return StoredResponse(
        id=response_id, tenant=tenant, model="m", status=status, created_at=100,
        body=json.dumps({"id": response_id}), input_items="[]", job=job,
    )  # fmt: skip


def usage(tokens: int) -> UsageRow:
    return UsageRow("acme", "m", 60, 1, tokens, tokens, 0.5, 0.0)


def test_a_response_is_read_and_deleted_by_its_tenant_only(job_store: JobStore) -> None:
    job_store.create_response(stored("resp_1"))
    assert job_store.get_response("other", "resp_1") is None
    assert not job_store.delete_response("other", "resp_1")
    found = job_store.get_response("acme", "resp_1")
    assert found is not None and json.loads(found.body) == {"id": "resp_1"}
    assert found.status is ResponseStatus.COMPLETED and found.job is None
    assert job_store.delete_response("acme", "resp_1")
    assert job_store.get_response("acme", "resp_1") is None
    assert not job_store.delete_response("acme", "resp_1")


def test_only_background_jobs_are_claimable_oldest_first(job_store: JobStore) -> None:
    job_store.create_response(stored("resp_done"))
    job_store.create_response(stored("resp_a", job="{}"))
    job_store.create_response(stored("resp_b", job="{}"))
    assert job_store.claimable_responses(0, 10) == [("resp_a", "m"), ("resp_b", "m")]
    assert job_store.claimable_responses(0, 1) == [("resp_a", "m")]


def test_a_claim_leases_fences_and_lapses(job_store: JobStore) -> None:
    job_store.create_response(stored("resp_a", job="{}"))
    first = job_store.claim_response("resp_a", "w1", 0, LEASE_S)
    assert first is not None and first.attempt == 1 and first.lease_owner == "w1"
    assert first.status is ResponseStatus.IN_PROGRESS
    assert job_store.claim_response("resp_a", "w2", LEASE_S - 1, LEASE_S) is None
    assert job_store.claimable_responses(LEASE_S - 1, 10) == []
    assert job_store.renew_response(first, LEASE_S - 1, LEASE_S)
    assert job_store.claim_response("resp_a", "w2", LEASE_S + 1, LEASE_S) is None  # renewed
    second = job_store.claim_response("resp_a", "w2", 2 * LEASE_S, LEASE_S)
    assert second is not None and second.attempt == 2
    # The first attempt lost the run: nothing it writes lands.
    assert not job_store.renew_response(first, 2 * LEASE_S, LEASE_S)
    assert not job_store.finish_response(first, ResponseStatus.COMPLETED, "{}", [usage(5)])
    assert not job_store.release_response(first)
    assert job_store.list_usage(0) == []


def test_a_finish_ends_the_job_and_counts_its_usage_once(job_store: JobStore) -> None:
    job_store.create_response(stored("resp_a", job='{"model": "m"}'))
    claimed = job_store.claim_response("resp_a", "w1", 0, LEASE_S)
    assert claimed is not None
    assert job_store.finish_response(claimed, ResponseStatus.INCOMPLETE, '{"done": 1}', [usage(7)])
    assert not job_store.finish_response(claimed, ResponseStatus.COMPLETED, "{}", [usage(7)])
    row = job_store.get_response("acme", "resp_a")
    assert row is not None and row.status is ResponseStatus.INCOMPLETE
    assert (row.body, row.job, row.lease_owner) == ('{"done": 1}', None, None)
    assert [r.input_tokens for r in job_store.list_usage(0)] == [7]
    assert job_store.claimable_responses(100 * LEASE_S, 10) == []


def test_a_released_job_is_queued_again(job_store: JobStore) -> None:
    job_store.create_response(stored("resp_a", job="{}"))
    claimed = job_store.claim_response("resp_a", "w1", 0, LEASE_S)
    assert claimed is not None and job_store.release_response(claimed)
    row = job_store.get_response("acme", "resp_a")
    assert row is not None and row.status is ResponseStatus.QUEUED
    again = job_store.claim_response("resp_a", "w2", 1, LEASE_S)
    assert again is not None and again.attempt == 2


def test_a_cancel_ends_a_queued_or_running_job_of_its_tenant(job_store: JobStore) -> None:
    job_store.create_response(stored("resp_a", job="{}"))
    job_store.create_response(stored("resp_b", job="{}"))
    job_store.create_response(stored("resp_done"))
    claimed = job_store.claim_response("resp_b", "w1", 0, LEASE_S)
    assert claimed is not None
    assert not job_store.cancel_response("other", "resp_a", "{}")
    assert job_store.cancel_response("acme", "resp_a", '{"c": 1}')
    assert job_store.cancel_response("acme", "resp_b", '{"c": 2}')
    assert not job_store.cancel_response("acme", "resp_done", "{}")
    assert not job_store.cancel_response("acme", "resp_a", "{}")  # already cancelled
    assert not job_store.finish_response(claimed, ResponseStatus.COMPLETED, "{}")
    assert not job_store.renew_response(claimed, 1, LEASE_S)
    for response_id, body in (("resp_a", '{"c": 1}'), ("resp_b", '{"c": 2}')):
        row = job_store.get_response("acme", response_id)
        assert row is not None and row.status is ResponseStatus.CANCELLED and row.body == body
    assert job_store.claimable_responses(100 * LEASE_S, 10) == []
