"""Deleting a batch and listing one endpoint's batches (Message Batches use both), on every
job store implementation."""

from __future__ import annotations

import dataclasses

from conveyor.stores import JobStore
from conveyor.stores.records import BatchStatus, ShardStatus
from tests.integration.stores.test_job_store import make_batch, shard_specs

MESSAGES = "/v1/messages"


def test_list_batches_of_one_endpoint_pages_within_it(job_store: JobStore) -> None:
    batches = [make_batch(created_at=1000 + i) for i in range(6)]
    batches = [dataclasses.replace(b, endpoint=MESSAGES) if i % 2 else b
               for i, b in enumerate(batches)]  # fmt: skip
    for batch in batches:
        job_store.create_batch(batch)
    job_store.create_batch(dataclasses.replace(make_batch(tenant="tenant-b"), endpoint=MESSAGES))
    mine = [b.id for b in reversed(batches) if b.endpoint == MESSAGES]

    first = job_store.list_batches("tenant-a", limit=2, endpoint=MESSAGES)
    rest = job_store.list_batches("tenant-a", after=first[-1].id, endpoint=MESSAGES)
    assert [b.id for b in first + rest] == mine
    ascending = job_store.list_batches("tenant-a", order="asc", endpoint=MESSAGES)
    assert [b.id for b in ascending] == mine[::-1]
    assert len(job_store.list_batches("tenant-a")) == 6  # no endpoint: every batch


def test_delete_batch_removes_it_and_its_shards_for_its_tenant_only(job_store: JobStore) -> None:
    batch, kept = make_batch(), make_batch()
    for record in (batch, kept):
        job_store.create_batch(record)
        job_store.add_shards(record.id, shard_specs(2))
    assert job_store.delete_batch("tenant-b", batch.id) is False  # another tenant's: untouched
    assert job_store.get_batch("tenant-a", batch.id) is not None

    assert job_store.delete_batch("tenant-a", batch.id) is True
    assert job_store.get_batch("tenant-a", batch.id) is None
    assert job_store.list_shards(batch.id) == []
    assert job_store.delete_batch("tenant-a", batch.id) is False
    # The other batch and its shards stay, and its shards can still be claimed.
    assert [s.status for s in job_store.list_shards(kept.id)] == [ShardStatus.PENDING] * 2
    job_store.transition(kept.id, [BatchStatus.VALIDATING], BatchStatus.IN_PROGRESS, now=1001)
    assert job_store.claim_shard("w", now=1002, lease_s=30) is not None
