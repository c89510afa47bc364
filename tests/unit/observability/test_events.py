"""Lifecycle events carry their event name and ids as structured fields."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from conveyor.fleet.registry import FleetRegistry
from conveyor.fleet.router import Ejections
from conveyor.stores import open_job_store

pytestmark = pytest.mark.anyio


def _events(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [r.fields for r in caplog.records if hasattr(r, "fields")]


async def test_a_new_worker_is_logged_once_as_joined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    store = open_job_store(f"sqlite://{tmp_path}/jobs.sqlite")
    registry = FleetRegistry(store, stale_after_s=5, reap_after_s=60)
    store.upsert_worker("w1", "http://a:1", ["syn"], 8, {}, time.time())
    await registry.refresh()
    await registry.refresh()
    joined = [e for e in _events(caplog) if e["event"] == "worker_joined"]
    assert joined == [
        {"event": "worker_joined", "worker_id": "w1", "address": "http://a:1", "models": ["syn"]}
    ]


def test_an_ejection_is_logged_when_it_starts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    ejections = Ejections(cooldown_s=1.0)
    ejections.eject("w2", 10.0)
    ejections.eject("w2", 10.5)
    assert _events(caplog) == [{"event": "worker_ejected", "worker_id": "w2"}]
