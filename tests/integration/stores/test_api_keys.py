"""The API key aggregate, on every job store implementation (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import dataclasses

import pytest

from conveyor.stores import JobStore, StoreError
from conveyor.tenants.keys import digest_hex, new_key_record


def test_created_keys_are_listed_oldest_first_without_the_key(job_store: JobStore) -> None:
    key_a, rec_a = new_key_record("acme", now=100)
    _, rec_b = new_key_record("globex", is_admin=True, now=200)
    job_store.create_api_key(rec_a)
    job_store.create_api_key(rec_b)
    listed = job_store.list_api_keys()
    assert listed == [rec_a, rec_b]
    assert listed[0].digest == digest_hex(key_a)
    assert key_a not in repr(listed)
    assert listed[1].is_admin


def test_a_repeated_id_or_digest_is_refused(job_store: JobStore) -> None:
    _, rec = new_key_record("acme", now=100)
    job_store.create_api_key(rec)
    with pytest.raises(StoreError):
        job_store.create_api_key(dataclasses.replace(rec, id="key_other"))
    with pytest.raises(StoreError):
        job_store.create_api_key(dataclasses.replace(rec, digest=digest_hex("other")))


def test_revoked_keys_leave_the_active_list(job_store: JobStore) -> None:
    _, rec_a = new_key_record("acme", now=100)
    _, rec_b = new_key_record("acme", now=101)
    job_store.create_api_key(rec_a)
    job_store.create_api_key(rec_b)
    assert job_store.revoke_api_key(rec_a.id, now=150)
    assert not job_store.revoke_api_key(rec_a.id, now=160)  # already revoked
    assert not job_store.revoke_api_key("key_unknown", now=160)
    assert [k.id for k in job_store.list_api_keys(include_revoked=False)] == [rec_b.id]
    revoked = job_store.list_api_keys()[0]
    assert revoked.revoked_at == 150 and revoked.is_revoked


def test_touch_moves_last_used_forward_only(job_store: JobStore) -> None:
    _, rec = new_key_record("acme", now=100)
    job_store.create_api_key(rec)
    job_store.touch_api_keys([rec.id, "key_unknown"], now=300)
    job_store.touch_api_keys([rec.id], now=200)
    job_store.touch_api_keys([], now=400)
    assert job_store.list_api_keys()[0].last_used_at == 300
