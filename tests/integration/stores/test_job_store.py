"""Job store behaviour, run against every implementation (in memory, SQLite, PostgreSQL).

All clocks are explicit `now` arguments, so lease expiry is tested without sleeping.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from conveyor.jobs.store import transition as checked_transition
from conveyor.stores import JobStore, StoreError, open_job_store
from conveyor.stores.migrations import (
    LATEST_VERSION,
    MIGRATIONS,
    Migration,
    apply_migrations,
    current_version,
)
from conveyor.stores.records import (
    BatchError,
    BatchRecord,
    BatchStatus,
    FileRecord,
    RequestCounts,
    ShardLease,
    ShardSpec,
    ShardStatus,
    new_batch_id,
    new_file_id,
)
from conveyor.stores.sql_store import SqlJobStore

LINES_PER_SHARD = 10
LEASE_S = 30.0


def make_file(tenant: str = "tenant-a", purpose: str = "batch", created_at: int = 1) -> FileRecord:
    """A file record with a fresh id."""
    file_id = new_file_id()
    return FileRecord(
        id=file_id,
        tenant=tenant,
        filename="input.jsonl",
        purpose=purpose,
        bytes=123,
        created_at=created_at,
        object_key=f"{tenant}/{file_id}",
    )


def make_batch(tenant: str = "tenant-a", created_at: int = 1000) -> BatchRecord:
    """A validating batch with a fresh id."""
    return BatchRecord(
        id=new_batch_id(),
        tenant=tenant,
        endpoint="/v1/chat/completions",
        input_file_id="file-abc",
        completion_window="24h",
        created_at=created_at,
        expires_at=created_at + 86_400,
    )


def shard_specs(num_shards: int) -> list[ShardSpec]:
    """Contiguous shards of LINES_PER_SHARD lines, 100 bytes per line."""
    return [
        ShardSpec(
            index=i,
            byte_start=i * LINES_PER_SHARD * 100,
            byte_end=(i + 1) * LINES_PER_SHARD * 100,
            first_line=i * LINES_PER_SHARD,
            num_lines=LINES_PER_SHARD,
        )
        for i in range(num_shards)
    ]


def running_batch(store: JobStore, num_shards: int, created_at: int = 1000) -> str:
    """Create a batch with shards and move it to in_progress; return its id."""
    batch = make_batch(created_at=created_at)
    store.create_batch(batch)
    store.add_shards(batch.id, shard_specs(num_shards))
    is_started = store.transition(
        batch.id, [BatchStatus.VALIDATING], BatchStatus.IN_PROGRESS, now=created_at + 1
    )
    if not is_started:
        raise RuntimeError("could not start the test batch")
    return batch.id


def claim(store: JobStore, now: float, worker_id: str = "worker-1") -> ShardLease:
    """Claim a shard and fail the test if none is available."""
    lease = store.claim_shard(worker_id, now=now, lease_s=LEASE_S)
    if lease is None:
        pytest.fail("expected a claimable shard")
    return lease


# -- files -----------------------------------------------------------------------------------


def test_files_are_isolated_per_tenant(job_store: JobStore) -> None:
    """Another tenant can neither see, list nor delete a file."""
    mine = make_file("tenant-a")
    job_store.create_file(mine)

    assert job_store.get_file("tenant-a", mine.id) == mine
    assert job_store.get_file("tenant-b", mine.id) is None
    assert job_store.list_files("tenant-b") == []
    assert job_store.delete_file("tenant-b", mine.id) is False
    assert job_store.delete_file("tenant-a", mine.id) is True
    assert job_store.get_file("tenant-a", mine.id) is None
    assert job_store.delete_file("tenant-a", mine.id) is False


def test_list_files_filters_purpose_and_pages_newest_first(job_store: JobStore) -> None:
    """Files list newest first, filter by purpose and page with `after`."""
    files = [make_file(purpose="batch" if i % 2 == 0 else "fine-tune") for i in range(5)]
    for rec in files:
        job_store.create_file(rec)
    batch_ids = [f.id for f in files if f.purpose == "batch"][::-1]

    assert [f.id for f in job_store.list_files("tenant-a")] == [f.id for f in files][::-1]
    assert [f.id for f in job_store.list_files("tenant-a", purpose="batch")] == batch_ids
    first = job_store.list_files("tenant-a", purpose="batch", limit=2)
    rest = job_store.list_files("tenant-a", purpose="batch", after=first[-1].id, limit=2)
    assert [f.id for f in first + rest] == batch_ids


def test_list_files_ascending_pages_oldest_first(job_store: JobStore) -> None:
    """`order=asc` lists oldest first and its `after` cursor moves forward."""
    files = [make_file(purpose="batch" if i % 2 == 0 else "fine-tune") for i in range(5)]
    for rec in files:
        job_store.create_file(rec)
    batch_ids = [f.id for f in files if f.purpose == "batch"]

    assert [f.id for f in job_store.list_files("tenant-a", order="asc")] == [f.id for f in files]
    first = job_store.list_files("tenant-a", purpose="batch", limit=2, order="asc")
    rest = job_store.list_files("tenant-a", purpose="batch", after=first[-1].id, order="asc")
    assert [f.id for f in first + rest] == batch_ids
    assert job_store.list_files("tenant-a", after=files[-1].id, order="asc") == []
    assert job_store.list_files("tenant-a", after="file-unknown", order="asc") == []


def test_expired_files_are_listed_across_tenants_soonest_first(job_store: JobStore) -> None:
    """Files whose `expires_at` has passed are listed for deletion, any tenant, soonest first."""
    late = dataclasses.replace(make_file("tenant-a"), expires_at=300)
    soon = dataclasses.replace(make_file("tenant-b"), expires_at=200)
    kept = make_file("tenant-a")
    for rec in (late, soon, kept):
        job_store.create_file(rec)

    assert job_store.get_file("tenant-a", late.id) == late
    assert job_store.expired_files(now=199, limit=10) == []
    assert job_store.expired_files(now=300, limit=10) == [soon, late]
    assert job_store.expired_files(now=10_000, limit=1) == [soon]
    with pytest.raises(ValueError, match="limit"):
        job_store.expired_files(now=300, limit=0)


# -- batches ---------------------------------------------------------------------------------


def test_batch_round_trips_every_field(job_store: JobStore) -> None:
    """Every stored batch field reads back unchanged; tenants are isolated."""
    batch = BatchRecord(
        id=new_batch_id(),
        tenant="tenant-a",
        endpoint="/v1/embeddings",
        input_file_id="file-in",
        completion_window="24h",
        created_at=1000,
        metadata={"project": "x"},
        model="tiny",
        expires_at=2000,
        errors=[BatchError(code="invalid_json", message="bad", param=None, line=3)],
        output_expires_after_s=7200,
    )
    job_store.create_batch(batch)

    assert job_store.get_batch("tenant-a", batch.id) == batch
    assert job_store.get_batch("tenant-b", batch.id) is None
    assert job_store.get_batch_any(batch.id) == batch
    assert job_store.get_batch_any(new_batch_id()) is None


def test_list_batches_newest_first_with_after_cursor(job_store: JobStore) -> None:
    """Paging with `after` walks all of a tenant's batches exactly once."""
    batches = [make_batch(created_at=1000 + i) for i in range(5)]
    for batch in batches:
        job_store.create_batch(batch)
    other = make_batch(tenant="tenant-b")
    job_store.create_batch(other)
    newest_first = [b.id for b in reversed(batches)]

    pages: list[str] = []
    after: str | None = None
    while page := job_store.list_batches("tenant-a", after=after, limit=2):
        pages.extend(b.id for b in page)
        after = page[-1].id
    assert pages == newest_first
    assert [b.id for b in job_store.list_batches("tenant-a")] == newest_first
    # A cursor naming another tenant's (or no) batch reveals nothing.
    assert job_store.list_batches("tenant-a", after=other.id) == []
    assert job_store.list_batches("tenant-a", after="batch_unknown") == []
    with pytest.raises(ValueError):
        job_store.list_batches("tenant-a", limit=0)


def test_list_batches_ascending_pages_oldest_first(job_store: JobStore) -> None:
    """`order=asc` lists oldest first and its `after` cursor moves forward."""
    batches = [make_batch(created_at=1000 + i) for i in range(3)]
    for batch in batches:
        job_store.create_batch(batch)
    job_store.create_batch(make_batch(tenant="tenant-b"))
    oldest_first = [b.id for b in batches]

    assert [b.id for b in job_store.list_batches("tenant-a", order="asc")] == oldest_first
    first = job_store.list_batches("tenant-a", limit=2, order="asc")
    rest = job_store.list_batches("tenant-a", after=first[-1].id, order="asc")
    assert [b.id for b in first + rest] == oldest_first
    assert job_store.list_batches("tenant-a", after=batches[-1].id, order="asc") == []
    assert job_store.list_batches("tenant-a", after="batch_unknown", order="asc") == []


def test_transition_is_compare_and_set(job_store: JobStore) -> None:
    """A transition applies only from the expected status and stamps `*_at`."""
    batch = make_batch()
    job_store.create_batch(batch)

    assert job_store.transition(
        batch.id, [BatchStatus.VALIDATING], BatchStatus.IN_PROGRESS, now=1234.9
    )
    # The same CAS again loses: the batch is no longer validating.
    assert not job_store.transition(
        batch.id, [BatchStatus.VALIDATING], BatchStatus.IN_PROGRESS, now=1300
    )
    started = job_store.get_batch_any(batch.id)
    assert started is not None
    assert started.status is BatchStatus.IN_PROGRESS
    assert started.in_progress_at == 1234

    assert job_store.transition(
        batch.id,
        [BatchStatus.IN_PROGRESS],
        BatchStatus.FINALIZING,
        now=1400,
    )
    assert job_store.transition(
        batch.id,
        [BatchStatus.FINALIZING],
        BatchStatus.COMPLETED,
        now=1500,
        output_file_id="file-out",
    )
    done = job_store.get_batch_any(batch.id)
    assert done is not None
    assert (done.status, done.finalizing_at, done.completed_at) == (
        BatchStatus.COMPLETED,
        1400,
        1500,
    )
    assert done.output_file_id == "file-out"
    assert not job_store.transition(
        new_batch_id(), [BatchStatus.VALIDATING], BatchStatus.FAILED, now=1
    )


def test_cancel_from_any_active_status(job_store: JobStore) -> None:
    """Cancelling works from validating and in_progress, once."""
    active = [BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS]
    waiting = make_batch()
    job_store.create_batch(waiting)
    running = running_batch(job_store, num_shards=1)

    for batch_id in (waiting.id, running):
        assert job_store.transition(batch_id, active, BatchStatus.CANCELLING, now=50)
        assert not job_store.transition(batch_id, active, BatchStatus.CANCELLING, now=51)
        assert job_store.transition(
            batch_id, [BatchStatus.CANCELLING], BatchStatus.CANCELLED, now=60
        )
        batch = job_store.get_batch_any(batch_id)
        assert batch is not None
        assert (batch.status, batch.cancelling_at, batch.cancelled_at) == (
            BatchStatus.CANCELLED,
            50,
            60,
        )
    # A cancelled batch's shards are no longer handed out.
    assert job_store.claim_shard("w", now=100, lease_s=LEASE_S) is None


def test_transition_rejects_forbidden_edges_and_fields(job_store: JobStore) -> None:
    """Lifecycle violations and unknown fields are programming errors.

    The lifecycle is the jobs package's rule: its checked `transition` refuses the edge before
    the store is asked; the store itself refuses what it cannot store.
    """
    batch = make_batch()
    job_store.create_batch(batch)

    with pytest.raises(ValueError, match="cannot move"):
        checked_transition(
            job_store, batch.id, [BatchStatus.COMPLETED], BatchStatus.IN_PROGRESS, now=1
        )
    with pytest.raises(ValueError):
        job_store.transition(batch.id, [], BatchStatus.FAILED, now=1)
    with pytest.raises(ValueError, match="cannot update"):
        job_store.transition(
            batch.id, [BatchStatus.VALIDATING], BatchStatus.FAILED, now=1, tenant="x"
        )
    failed_validation = [BatchError(code="missing_model", message="no model", line=1)]
    assert job_store.transition(
        batch.id, [BatchStatus.VALIDATING], BatchStatus.FAILED, now=5, errors=failed_validation
    )
    failed = job_store.get_batch_any(batch.id)
    assert failed is not None
    assert (failed.status, failed.failed_at, failed.errors) == (
        BatchStatus.FAILED,
        5,
        failed_validation,
    )


def test_update_batch_fields(job_store: JobStore) -> None:
    """Non-status fields update; status and bad metadata are rejected."""
    batch = make_batch()
    job_store.create_batch(batch)

    assert job_store.update_batch_fields(batch.id, error_file_id="file-err", metadata={"k": "v"})
    updated = job_store.get_batch_any(batch.id)
    assert updated is not None
    assert (updated.error_file_id, updated.metadata) == ("file-err", {"k": "v"})
    assert updated.status is BatchStatus.VALIDATING
    assert not job_store.update_batch_fields(new_batch_id(), model="m")
    with pytest.raises(ValueError):
        job_store.update_batch_fields(batch.id, status="completed")
    with pytest.raises(ValueError):
        job_store.update_batch_fields(batch.id, metadata={"k": 1})


def test_batches_in_status_lists_oldest_first_across_tenants(job_store: JobStore) -> None:
    """Status scans see every tenant, oldest batch first."""
    first = running_batch(job_store, num_shards=1, created_at=1000)
    waiting = make_batch(tenant="tenant-b", created_at=1001)
    job_store.create_batch(waiting)
    second = running_batch(job_store, num_shards=1, created_at=1002)

    running = job_store.batches_in_status([BatchStatus.IN_PROGRESS])
    assert [b.id for b in running] == [first, second]
    both = job_store.batches_in_status([BatchStatus.IN_PROGRESS, BatchStatus.VALIDATING])
    assert [b.id for b in both] == [first, waiting.id, second]
    assert job_store.batches_in_status([BatchStatus.EXPIRED]) == []


# -- shards ----------------------------------------------------------------------------------


def test_request_counts_are_summed_from_shards(job_store: JobStore) -> None:
    """Counts follow shard progress and never double count a retried shard."""
    batch_id = running_batch(job_store, num_shards=3)

    def counts() -> RequestCounts:
        batch = job_store.get_batch_any(batch_id)
        assert batch is not None
        return batch.request_counts

    assert counts() == RequestCounts(total=30, completed=0, failed=0)
    first = claim(job_store, now=0)
    second = claim(job_store, now=0)
    assert job_store.report_progress(first, num_completed=4, num_failed=1)
    assert job_store.report_progress(second, num_completed=2, num_failed=0)
    assert counts() == RequestCounts(total=30, completed=6, failed=1)
    assert job_store.commit_shard(first, 1, "out/0", "err/0", num_completed=9, num_failed=1)
    assert counts() == RequestCounts(total=30, completed=11, failed=1)

    # The second shard's lease lapses and another worker redoes it: the stale progress is
    # replaced by the new attempt's, never added to it.
    retry = claim(job_store, now=LEASE_S + 1, worker_id="worker-2")
    assert (retry.index, retry.attempt) == (second.index, 2)
    assert counts() == RequestCounts(total=30, completed=9, failed=1)
    assert job_store.report_progress(retry, num_completed=3, num_failed=0)
    assert counts() == RequestCounts(total=30, completed=12, failed=1)


def test_peak_counts_keep_what_a_lost_attempt_reported(job_store: JobStore) -> None:
    """Each shard's highest reported counts survive a reclaim and a release (the live counts
    start over), so what a client was shown can be kept from going backwards."""
    batch_id = running_batch(job_store, num_shards=2)

    def peak() -> RequestCounts:
        batch = job_store.get_batch_any(batch_id)
        assert batch is not None
        return batch.peak_counts

    assert peak() == RequestCounts(total=20, completed=0, failed=0)
    first = claim(job_store, now=0)
    second = claim(job_store, now=0)
    assert job_store.report_progress(first, num_completed=4, num_failed=1)
    assert job_store.report_progress(second, num_completed=6, num_failed=0)
    assert peak() == RequestCounts(total=20, completed=10, failed=1)

    retry = claim(job_store, now=LEASE_S + 1, worker_id="worker-2")
    assert retry.index == first.index  # the first shard's lease lapsed first
    assert job_store.report_progress(retry, num_completed=2, num_failed=2)
    batch = job_store.get_batch_any(batch_id)
    assert batch is not None
    assert batch.request_counts == RequestCounts(total=20, completed=8, failed=2)
    assert batch.peak_counts == RequestCounts(total=20, completed=10, failed=2)
    assert job_store.release_shard(retry)
    assert peak() == RequestCounts(total=20, completed=10, failed=2)

    again = claim(job_store, now=LEASE_S + 2, worker_id="worker-3")
    assert job_store.commit_shard(again, LEASE_S + 3, "out/0", None, 9, 1)
    assert peak() == RequestCounts(total=20, completed=15, failed=2)


def test_claims_oldest_running_batch_first(job_store: JobStore) -> None:
    """Only in_progress batches hand out shards, oldest batch first."""
    waiting = make_batch(created_at=900)
    job_store.create_batch(waiting)
    job_store.add_shards(waiting.id, shard_specs(2))
    older = running_batch(job_store, num_shards=2, created_at=1000)
    newer = running_batch(job_store, num_shards=1, created_at=1001)

    order = [(lease.batch_id, lease.index) for lease in (claim(job_store, 0) for _ in range(3))]
    assert order == [(older, 0), (older, 1), (newer, 0)]
    # The validating batch's shards are never handed out.
    assert job_store.claim_shard("worker-1", now=0, lease_s=LEASE_S) is None


def test_claim_can_be_restricted_to_batches(job_store: JobStore) -> None:
    """`batch_ids` limits which batches a claim may take from."""
    older = running_batch(job_store, num_shards=1, created_at=1000)
    newer = running_batch(job_store, num_shards=1, created_at=1001)

    lease = job_store.claim_shard("w", now=0, lease_s=LEASE_S, batch_ids=[newer])
    assert lease is not None
    assert lease.batch_id == newer
    assert job_store.claim_shard("w", now=0, lease_s=LEASE_S, batch_ids=[newer]) is None
    assert job_store.claim_shard("w", now=0, lease_s=LEASE_S, batch_ids=[]) is None
    remaining = job_store.claim_shard("w", now=0, lease_s=LEASE_S)
    assert remaining is not None
    assert remaining.batch_id == older


def test_concurrent_claimers_never_share_a_shard(job_store_url: str) -> None:
    """Two connections claiming at once never get the same shard attempt."""
    num_shards = 60
    setup = open_job_store(job_store_url)
    stores = [open_job_store(job_store_url) for _ in range(2)]
    try:
        running_batch(setup, num_shards=num_shards)
        claimed: list[list[tuple[str, int, int]]] = [[], []]
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def hammer(slot: int) -> None:
            try:
                start.wait()
                while lease := stores[slot].claim_shard(f"w{slot}", now=0, lease_s=LEASE_S):
                    claimed[slot].append((lease.batch_id, lease.index, lease.attempt))
            except BaseException as exc:  # surfaced to the main thread below
                errors.append(exc)

        threads = [threading.Thread(target=hammer, args=(slot,)) for slot in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        every_claim = claimed[0] + claimed[1]
        assert len(every_claim) == len(set(every_claim)) == num_shards
        assert {attempt for _, _, attempt in every_claim} == {1}
        assert setup.count_shards(every_claim[0][0])[ShardStatus.LEASED] == num_shards
    finally:
        for store in [setup, *stores]:
            store.close()


def test_expired_lease_is_reclaimed_and_the_old_attempt_is_fenced(job_store: JobStore) -> None:
    """A lapsed lease is re-issued as attempt+1; the old attempt changes nothing."""
    batch_id = running_batch(job_store, num_shards=1)
    old = claim(job_store, now=100, worker_id="slow")

    assert job_store.claim_shard("fast", now=100 + LEASE_S - 1, lease_s=LEASE_S) is None
    new = claim(job_store, now=100 + LEASE_S, worker_id="fast")
    assert (new.index, new.attempt, new.worker_id) == (old.index, old.attempt + 1, "fast")

    later = 100 + LEASE_S + 1
    assert not job_store.renew_lease(old, now=later, lease_s=LEASE_S)
    assert not job_store.report_progress(old, num_completed=10, num_failed=0)
    assert not job_store.commit_shard(old, later, "stale/out", None, 10, 0)
    [shard] = job_store.list_shards(batch_id)
    assert (shard.status, shard.attempt, shard.lease_owner) == (ShardStatus.LEASED, 2, "fast")
    assert (shard.output_key, shard.num_completed) == (None, 0)

    assert job_store.commit_shard(new, later, "fresh/out", "fresh/err", 8, 2)
    [shard] = job_store.list_shards(batch_id)
    assert (shard.status, shard.output_key, shard.error_key) == (
        ShardStatus.DONE,
        "fresh/out",
        "fresh/err",
    )
    assert (shard.num_completed, shard.num_failed, shard.committed_at) == (8, 2, later)
    # A done shard is never claimed again, and cannot be committed twice.
    assert job_store.claim_shard("any", now=10_000, lease_s=LEASE_S) is None
    assert not job_store.commit_shard(new, later, "again", None, 8, 2)


def test_a_worker_that_reclaims_its_own_expired_shard_fences_its_old_attempt(
    job_store: JobStore,
) -> None:
    """Fencing is by attempt: the same worker's lapsed attempt 1 is dead once it holds attempt 2.

    A worker can lose its lease (a long pause), claim the same shard again, and only then
    resume the old run; that stale run must not renew, report, commit or release anything.
    """
    batch_id = running_batch(job_store, num_shards=1)
    old = claim(job_store, now=100, worker_id="w")
    new = claim(job_store, now=100 + LEASE_S, worker_id="w")
    assert (new.index, new.attempt, new.worker_id) == (old.index, 2, "w")

    later = 100 + LEASE_S + 1
    assert not job_store.renew_lease(old, now=later, lease_s=LEASE_S)
    assert not job_store.report_progress(old, num_completed=10, num_failed=0)
    assert not job_store.commit_shard(old, later, "stale/out", None, 10, 0)
    assert not job_store.release_shard(old)
    [shard] = job_store.list_shards(batch_id)
    assert (shard.status, shard.attempt, shard.lease_owner) == (ShardStatus.LEASED, 2, "w")
    assert (shard.output_key, shard.num_completed, shard.lease_expires_at) == (
        None,
        0,
        100 + 2 * LEASE_S,
    )

    assert job_store.commit_shard(new, later, "fresh/out", None, 10, 0)
    [shard] = job_store.list_shards(batch_id)
    assert (shard.status, shard.output_key) == (ShardStatus.DONE, "fresh/out")


def test_commit_needs_an_unexpired_lease_and_renewal_extends_it(job_store: JobStore) -> None:
    """Commit needs a live lease; renewing before a takeover keeps it live."""
    batch_id = running_batch(job_store, num_shards=1)
    lease = claim(job_store, now=0)

    assert not job_store.commit_shard(lease, LEASE_S, "out", None, 10, 0)
    # Nobody took the shard over, so the same attempt may renew and then commit.
    assert job_store.renew_lease(lease, now=LEASE_S, lease_s=LEASE_S)
    [shard] = job_store.list_shards(batch_id)
    assert shard.lease_expires_at == 2 * LEASE_S
    assert job_store.commit_shard(lease, 2 * LEASE_S - 1, "out", None, 10, 0)
    assert not job_store.renew_lease(lease, now=2 * LEASE_S, lease_s=LEASE_S)


def test_release_returns_the_shard_and_fences_the_released_attempt(job_store: JobStore) -> None:
    """A released shard is pending again and its old attempt is dead."""
    batch_id = running_batch(job_store, num_shards=2)
    lease = claim(job_store, now=0)
    assert job_store.report_progress(lease, num_completed=5, num_failed=0)
    assert job_store.count_shards(batch_id) == {
        ShardStatus.PENDING: 1,
        ShardStatus.LEASED: 1,
        ShardStatus.DONE: 0,
    }

    assert job_store.release_shard(lease)
    assert not job_store.release_shard(lease)
    [shard, _] = job_store.list_shards(batch_id)
    assert (shard.status, shard.lease_owner, shard.num_completed) == (ShardStatus.PENDING, None, 0)
    assert not job_store.commit_shard(lease, 1, "out", None, 10, 0)
    again = claim(job_store, now=1)
    assert (again.index, again.attempt) == (lease.index, lease.attempt + 1)


def test_lease_calls_validate_their_arguments(job_store: JobStore) -> None:
    """Impossible lease arguments raise ValueError instead of reaching SQL."""
    running_batch(job_store, num_shards=1)
    lease = claim(job_store, now=0)

    with pytest.raises(ValueError):
        job_store.claim_shard("w", now=0, lease_s=0)
    with pytest.raises(ValueError):
        job_store.claim_shard("", now=0, lease_s=LEASE_S)
    with pytest.raises(ValueError):
        job_store.report_progress(lease, num_completed=-1, num_failed=0)
    with pytest.raises(ValueError):
        job_store.commit_shard(lease, 1, "out", None, LINES_PER_SHARD, 1)


def test_add_shards_is_one_transaction(job_store: JobStore) -> None:
    """A failing add_shards inserts nothing; bad input is rejected."""
    batch = make_batch()
    job_store.create_batch(batch)
    job_store.add_shards(batch.id, shard_specs(2))

    clashing = [*shard_specs(3)[2:], shard_specs(2)[1]]
    with pytest.raises(StoreError):
        job_store.add_shards(batch.id, clashing)
    assert [s.index for s in job_store.list_shards(batch.id)] == [0, 1]
    with pytest.raises(StoreError, match="no batch"):
        job_store.add_shards(new_batch_id(), shard_specs(1))
    with pytest.raises(ValueError, match="duplicate"):
        job_store.add_shards(batch.id, [shard_specs(1)[0], shard_specs(1)[0]])


# -- schema, cache, workers, errors ----------------------------------------------------------


def test_opening_twice_keeps_schema_and_data(job_store_url: str) -> None:
    """Reopening a migrated database keeps its rows."""
    first = open_job_store(job_store_url)
    rec = make_file()
    first.create_file(rec)
    first.close()

    second = open_job_store(job_store_url)
    try:
        assert second.get_file(rec.tenant, rec.id) == rec
    finally:
        second.close()


def test_migrations_apply_only_new_versions(job_store: JobStore) -> None:
    """The runner applies each version once and refuses newer schemas."""
    if not isinstance(job_store, SqlJobStore):
        pytest.skip("migrations only exist for SQL stores")
    extra = Migration(LATEST_VERSION + 1, "test table", ("CREATE TABLE scratch (x INTEGER)",))
    dialect = job_store.dialect
    # Drive the runner through the store's own write session (what opening does).
    with job_store._session(is_write=True) as session:
        assert apply_migrations(session, dialect) == []
        assert apply_migrations(session, dialect, [*MIGRATIONS, extra]) == [extra.version]
        assert apply_migrations(session, dialect, [*MIGRATIONS, extra]) == []
        assert current_version(session, dialect) == extra.version
        # Code that only knows older versions refuses a newer schema.
        with pytest.raises(StoreError, match="newer"):
            apply_migrations(session, dialect)


def test_result_cache_is_idempotent(job_store: JobStore) -> None:
    """Cache entries are binary-safe and a repeated put is harmless."""
    value = bytes(range(256))

    assert job_store.cache_get_many(["sha256:abc"]) == {}
    job_store.cache_put_many({"sha256:abc": value})
    job_store.cache_put_many({"sha256:abc": b"other", "sha256:def": b""})
    assert job_store.cache_get_many(["sha256:abc", "sha256:def", "sha256:x"]) == {
        "sha256:abc": value,
        "sha256:def": b"",
    }
    assert job_store.cache_get_many([]) == {}
    with pytest.raises(ValueError):
        job_store.cache_put_many({"": b"x"})


def test_worker_registry_reports_heartbeat_age(job_store: JobStore) -> None:
    """Workers report heartbeat age, staleness, refreshes and removal."""
    job_store.upsert_worker("w1", "http://a:8000", ["m1"], 4, {"queued": 2}, now=100)
    job_store.upsert_worker("w2", "http://b:8000", ["m1", "m2"], 8, {}, now=90)

    fresh, stale = job_store.list_workers(now=105, stale_after_s=10)
    assert (fresh.worker_id, fresh.heartbeat_age_s, fresh.is_stale) == ("w1", 5, False)
    assert (fresh.models, fresh.load) == (("m1",), {"queued": 2})
    assert (stale.worker_id, stale.heartbeat_age_s, stale.is_stale) == ("w2", 15, True)

    job_store.upsert_worker("w2", "http://b:9000", ["m2"], 2, {"queued": 0}, now=104)
    _, revived = job_store.list_workers(now=105, stale_after_s=10)
    assert (revived.address, revived.capacity, revived.is_stale) == ("http://b:9000", 2, False)
    assert job_store.remove_worker("w1")
    assert not job_store.remove_worker("w1")
    assert [w.worker_id for w in job_store.list_workers(now=105, stale_after_s=10)] == ["w2"]


def test_driver_errors_become_store_error(job_store: JobStore) -> None:
    """A constraint violation surfaces as StoreError chained to the driver error."""
    if not isinstance(job_store, SqlJobStore):
        pytest.skip("only SQL stores have a driver")
    rec = make_file()
    job_store.create_file(rec)

    with pytest.raises(StoreError) as raised:
        job_store.create_file(rec)
    assert raised.value.__cause__ is not None


def test_closed_store_raises_store_error(job_store_url: str) -> None:
    """A closed store fails loudly; closing twice is fine."""
    store = open_job_store(job_store_url)
    store.close()
    store.close()
    with pytest.raises(StoreError):
        store.get_file("tenant-a", "file-x")


def test_open_job_store_rejects_unknown_urls() -> None:
    """Unknown URL schemes are a ValueError."""
    with pytest.raises(ValueError):
        open_job_store("mysql://localhost/db")


def test_records_reject_bad_input() -> None:
    """Record dataclasses validate their fields."""
    with pytest.raises(ValueError):
        ShardSpec(index=0, byte_start=10, byte_end=5, first_line=0, num_lines=1)
    with pytest.raises(ValueError):
        FileRecord("file-1", "t", "f", "batch", -1, 0, "k")
    with pytest.raises(ValueError, match="batch id"):
        BatchRecord("not-a-batch", "t", "/v1/embeddings", "file-x", "24h", created_at=0)
    with pytest.raises(ValueError, match="metadata"):
        BatchRecord(
            new_batch_id(),
            "t",
            "/v1/embeddings",
            "file-x",
            "24h",
            created_at=0,
            metadata={"k": 1},  # type: ignore[dict-item]
        )
