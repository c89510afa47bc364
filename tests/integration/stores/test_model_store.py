"""Model manifests and the chunk tracker, on every job store (in memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import pytest

from conveyor.stores import JobStore
from conveyor.stores.model_records import HolderState, ManifestRecord

A, B, C = ("a" * 64, "b" * 64, "c" * 64)


def manifest(name: str, digest: str = "d1", created_at: float = 1.0) -> ManifestRecord:
    """A manifest record (its JSON is opaque to the store)."""
    return ManifestRecord(name, digest, 123, '{"files": []}', created_at)


def test_manifests_are_put_replaced_listed_and_deleted(job_store: JobStore) -> None:
    assert job_store.get_manifest("m") is None
    job_store.put_manifest(manifest("m", "d1"))
    job_store.put_manifest(manifest("org/a:v1", "d0"))
    job_store.put_manifest(manifest("m", "d2", created_at=2.0))
    assert job_store.get_manifest("m") == manifest("m", "d2", created_at=2.0)
    assert [r.name for r in job_store.list_manifests()] == ["m", "org/a:v1"]
    assert job_store.delete_manifest("m")
    assert not job_store.delete_manifest("m")
    assert [r.name for r in job_store.list_manifests()] == ["org/a:v1"]


def test_tracker_records_holders_and_upgrades_fetching_to_have(job_store: JobStore) -> None:
    job_store.record_chunks("w1", "http://w1", "z1", [A, B], HolderState.FETCHING, now=1.0)
    job_store.record_chunks("w2", "http://w2", None, [A], HolderState.HAVE, now=2.0)
    job_store.record_chunks("w1", "http://w1:2", "z1", [A], HolderState.HAVE, now=3.0)
    holders = job_store.chunk_holders([A, B, C])
    got = [(h.digest, h.worker_id, h.address, h.zone, h.state, h.updated_at) for h in holders]
    assert got == [
        (A, "w1", "http://w1:2", "z1", HolderState.HAVE, 3.0),
        (A, "w2", "http://w2", None, HolderState.HAVE, 2.0),
        (B, "w1", "http://w1", "z1", HolderState.FETCHING, 1.0),
    ]
    assert job_store.chunk_holders([]) == []


def test_tracker_forgets_some_or_all_of_a_workers_chunks(job_store: JobStore) -> None:
    job_store.record_chunks("w1", "http://w1", None, [A, B, C], HolderState.HAVE, now=1.0)
    job_store.record_chunks("w2", "http://w2", None, [A], HolderState.HAVE, now=1.0)
    assert job_store.forget_chunks("w1", [A]) == 1
    assert job_store.forget_chunks("w1", []) == 0
    assert [(h.digest, h.worker_id) for h in job_store.chunk_holders([A])] == [(A, "w2")]
    assert job_store.forget_chunks("w1") == 2
    assert [h.worker_id for h in job_store.chunk_holders([A, B, C])] == ["w2"]


def test_tracker_refuses_an_empty_worker_id(job_store: JobStore) -> None:
    with pytest.raises(ValueError):
        job_store.record_chunks("", "http://x", None, [A], HolderState.HAVE, now=1.0)


def test_touch_stamps_every_hold_of_one_worker(job_store: JobStore) -> None:
    job_store.record_chunks("w1", "http://w1", None, [A, B], HolderState.HAVE, now=1.0)
    job_store.record_chunks("w2", "http://w2", None, [A], HolderState.HAVE, now=1.0)
    assert job_store.touch_chunks("w1", now=9.0) == 2
    stamps = {(h.digest, h.worker_id): h.updated_at for h in job_store.chunk_holders([A, B])}
    assert stamps == {(A, "w1"): 9.0, (A, "w2"): 1.0, (B, "w1"): 9.0}
