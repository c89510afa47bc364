"""Straggler speculation in the job store, on SQLite and PostgreSQL.

A speculative lease runs a straggling shard a second time beside its original; both may
commit, the first commit wins and the second is refused.
"""

from __future__ import annotations

import dataclasses

import pytest

from conveyor.jobs.leases import SpeculationPolicy
from conveyor.stores import JobStore
from conveyor.stores.records import ShardLease, ShardStatus
from tests.integration.stores.test_job_store import LEASE_S, claim, running_batch

POLICY = SpeculationPolicy(slow_factor=3.0, min_running_s=5.0)
T0 = 2000.0


def straggler_setup(store: JobStore) -> tuple[str, ShardLease]:
    """Two shards claimed at T0 by worker-1; shard 0 committed after 1 s, shard 1 still runs."""
    batch_id = running_batch(store, num_shards=2)
    fast = claim(store, T0)
    slow = claim(store, T0)
    assert store.commit_shard(fast, T0 + 1, "out-fast", None, 10, 0)
    return batch_id, slow


def renewed(store: JobStore, lease: ShardLease, now: float) -> None:
    """Keep a lease alive up to `now` (the original keeps heartbeating while it straggles)."""
    assert store.renew_lease(lease, now - 1, LEASE_S)


def test_policy_needs_a_median_and_both_thresholds() -> None:
    assert not POLICY.is_straggler(100.0, [])
    assert not POLICY.is_straggler(4.0, [0.1])  # under min_running_s
    assert not POLICY.is_straggler(8.0, [2.0, 3.0, 4.0])  # under 3 x median (9 s)
    assert POLICY.is_straggler(10.0, [2.0, 3.0, 4.0])
    with pytest.raises(ValueError):
        SpeculationPolicy(slow_factor=0.5)
    with pytest.raises(ValueError):
        SpeculationPolicy(min_running_s=-1)


def test_only_a_straggler_on_another_worker_is_speculated(job_store: JobStore) -> None:
    _, slow = straggler_setup(job_store)
    renewed(job_store, slow, T0 + 4)
    # Running 4 s: under min_running_s.
    assert job_store.claim_speculative("worker-2", T0 + 4, LEASE_S, POLICY) is None
    renewed(job_store, slow, T0 + 6)
    # The holder itself never speculates on its own shard.
    assert job_store.claim_speculative("worker-1", T0 + 6, LEASE_S, POLICY) is None
    spec = job_store.claim_speculative("worker-2", T0 + 6, LEASE_S, POLICY)
    assert spec is not None and spec.is_speculative
    assert (spec.index, spec.attempt, spec.worker_id) == (slow.index, slow.attempt, "worker-2")
    # One speculative run per shard.
    assert job_store.claim_speculative("worker-3", T0 + 6, LEASE_S, POLICY) is None


@pytest.mark.parametrize("first", ["original", "speculative"])
def test_the_first_commit_wins_and_the_other_is_refused(job_store: JobStore, first: str) -> None:
    batch_id, slow = straggler_setup(job_store)
    renewed(job_store, slow, T0 + 6)
    spec = job_store.claim_speculative("worker-2", T0 + 6, LEASE_S, POLICY)
    assert spec is not None
    # Both hold their lease while neither committed; the speculative run reports no progress.
    assert job_store.renew_lease(slow, T0 + 7, LEASE_S)
    assert job_store.renew_lease(spec, T0 + 7, LEASE_S)
    assert job_store.report_progress(spec, 3, 0)
    winner, loser = (slow, spec) if first == "original" else (spec, slow)
    assert job_store.commit_shard(winner, T0 + 8, f"out-{first}", None, 10, 0)
    assert not job_store.commit_shard(loser, T0 + 8, "out-late", None, 10, 0)
    assert not job_store.renew_lease(loser, T0 + 8, LEASE_S)
    shard = job_store.list_shards(batch_id)[1]
    assert shard.status is ShardStatus.DONE and shard.output_key == f"out-{first}"
    assert job_store.count_shards(batch_id)[ShardStatus.DONE] == 2


def test_releasing_the_speculative_run_leaves_the_original_running(job_store: JobStore) -> None:
    batch_id, slow = straggler_setup(job_store)
    renewed(job_store, slow, T0 + 6)
    spec = job_store.claim_speculative("worker-2", T0 + 6, LEASE_S, POLICY)
    assert spec is not None
    assert job_store.release_shard(spec)
    assert not job_store.commit_shard(spec, T0 + 7, "out-spec", None, 10, 0)
    assert job_store.list_shards(batch_id)[1].status is ShardStatus.LEASED
    # The slot is free again for another speculative run.
    again = job_store.claim_speculative("worker-3", T0 + 7, LEASE_S, POLICY)
    assert again is not None and again.worker_id == "worker-3"
    assert job_store.commit_shard(slow, T0 + 8, "out-slow", None, 10, 0)


def test_a_reclaimed_shard_ends_its_speculative_run(job_store: JobStore) -> None:
    _, slow = straggler_setup(job_store)
    renewed(job_store, slow, T0 + 6)
    spec = job_store.claim_speculative("worker-2", T0 + 6, LEASE_S, POLICY)
    assert spec is not None
    # The original's lease lapses and the shard is claimed afresh: both old runs are fenced.
    fresh = claim(job_store, T0 + 6 + LEASE_S, worker_id="worker-3")
    assert fresh.attempt == slow.attempt + 1
    assert not job_store.renew_lease(spec, T0 + 6 + LEASE_S, LEASE_S)
    assert not job_store.commit_shard(spec, T0 + 6 + LEASE_S, "out-spec", None, 10, 0)
    assert job_store.commit_shard(fresh, T0 + 7 + LEASE_S, "out-fresh", None, 10, 0)


def test_a_speculative_run_renews_past_its_first_lease(job_store: JobStore) -> None:
    _, slow = straggler_setup(job_store)
    renewed(job_store, slow, T0 + 6)
    spec = job_store.claim_speculative("worker-2", T0 + 6, LEASE_S, POLICY)
    assert spec is not None
    # Renewing, then reporting progress (a no-op for a speculative run) keeps the new expiry.
    later = T0 + 6 + LEASE_S - 1
    assert job_store.renew_lease(spec, later, LEASE_S)
    assert job_store.report_progress(spec, 5, 0)
    assert job_store.commit_shard(spec, later + LEASE_S - 1, "out-spec", None, 10, 0)


def test_the_attempt_alone_does_not_make_a_holder(job_store: JobStore) -> None:
    """The speculative run shares the original's attempt number, so fencing also names the holder.

    A lease carrying the right attempt but another worker (here: the speculative worker's,
    presented as an original lease) changes nothing on the original's lease.
    """
    batch_id, slow = straggler_setup(job_store)
    renewed(job_store, slow, T0 + 6)
    spec = job_store.claim_speculative("worker-2", T0 + 6, LEASE_S, POLICY)
    assert spec is not None and spec.attempt == slow.attempt
    posing = dataclasses.replace(spec, is_speculative=False)
    assert not job_store.renew_lease(posing, T0 + 7, LEASE_S)
    assert not job_store.report_progress(posing, 5, 0)
    assert not job_store.commit_shard(posing, T0 + 7, "out-posing", None, 10, 0)
    assert not job_store.release_shard(posing)
    shard = job_store.list_shards(batch_id)[1]
    assert (shard.status, shard.lease_owner, shard.output_key) == (
        ShardStatus.LEASED,
        "worker-1",
        None,
    )
    assert job_store.commit_shard(slow, T0 + 8, "out-slow", None, 10, 0)
