"""The usage ledger aggregate, on every job store implementation (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import pytest

from conveyor.stores import JobStore
from conveyor.stores.tenant_records import UsageRow
from tests.integration.stores.test_job_store import LEASE_S, claim, running_batch


def row(tenant: str, model: str, minute: int, tokens: int, model_s: float = 0.5) -> UsageRow:
    """One request's usage in minute number `minute`."""
    return UsageRow(tenant, model, minute * 60, 1, tokens, 2 * tokens, model_s, model_s / 1440)


def test_rows_of_one_key_are_summed(job_store: JobStore) -> None:
    job_store.add_usage([row("acme", "m", 1, 10), row("acme", "m", 1, 5)])
    job_store.add_usage([row("acme", "m", 1, 1, model_s=0.25)])
    [summed] = job_store.list_usage(0)
    assert (summed.num_requests, summed.input_tokens, summed.output_tokens) == (3, 16, 32)
    assert summed.model_s == pytest.approx(1.25)
    assert summed.cost_usd == pytest.approx(1.25 / 1440)


def test_listing_filters_time_and_tenant_oldest_first(job_store: JobStore) -> None:
    job_store.add_usage([row("b", "m", 3, 1), row("a", "m", 1, 1), row("a", "n", 2, 1)])
    job_store.add_usage([])
    assert [(r.tenant, r.minute_start) for r in job_store.list_usage(0)] == [
        ("a", 60),
        ("a", 120),
        ("b", 180),
    ]
    assert [r.model for r in job_store.list_usage(0, tenant="a")] == ["m", "n"]
    assert job_store.list_usage(0, tenant="nobody") == []
    assert [r.minute_start for r in job_store.list_usage(120, 180)] == [120]


def test_a_commit_adds_its_usage_and_the_batch_tokens_once(job_store: JobStore) -> None:
    batch_id = running_batch(job_store, num_shards=2)
    lease = claim(job_store, now=0)
    usage = [row("tenant-a", "m", 0, 10), row("tenant-a", "m", 1, 4)]
    assert job_store.commit_shard(lease, 1, "out", None, 10, 0, usage=usage)
    # A repeated (stale) commit changes nothing: the usage is not counted twice.
    assert not job_store.commit_shard(lease, 2, "out", None, 10, 0, usage=usage)
    batch = job_store.get_batch_any(batch_id)
    assert batch is not None
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (14, 28)
    assert sum(r.input_tokens for r in job_store.list_usage(0)) == 14


def test_a_fenced_out_commit_records_no_usage(job_store: JobStore) -> None:
    batch_id = running_batch(job_store, num_shards=1)
    stale = claim(job_store, now=0)
    claim(job_store, now=LEASE_S + 1, worker_id="worker-2")  # takes the expired lease over
    assert not job_store.commit_shard(
        stale, LEASE_S + 2, "out", None, 10, 0, usage=[row("x", "m", 0, 9)]
    )
    assert job_store.list_usage(0) == []
    batch = job_store.get_batch_any(batch_id)
    assert batch is not None and batch.usage.total_tokens == 0


def test_rows_refuse_partial_minutes_and_negative_use() -> None:
    with pytest.raises(ValueError):
        UsageRow("a", "m", 61)
    with pytest.raises(ValueError):
        UsageRow("a", "m", 60, input_tokens=-1)
    with pytest.raises(ValueError):
        row("a", "m", 1, 1).plus(row("a", "m", 2, 1))
