"""Lifecycle events carry their event name and ids as structured fields."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from conveyor.batching.batcher import Batcher, BatcherSettings
from conveyor.config.model_config import SyntheticModelConfig
from conveyor.fleet.registry import FleetRegistry
from conveyor.fleet.router import Ejections
from conveyor.models.synthetic import SyntheticModel
from conveyor.observability.metrics import Metrics
from conveyor.priority import Priority
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
    ejections = Ejections(cooldown_s=1.5)
    ejections.eject("w2", 10.0)
    assert _events(caplog) == [{"event": "worker_ejected", "worker_id": "w2"}]
    assert caplog.records[-1].getMessage() == "ejected worker w2 for 1.5 s"
    ejections.eject("w2", 10.5)  # still ejected: not logged again
    assert _events(caplog) == [{"event": "worker_ejected", "worker_id": "w2"}]


async def test_an_out_of_memory_backoff_is_logged_with_its_sizes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    model = SyntheticModel(
        SyntheticModelConfig(name="s", kind="synthetic", batch_latency_ms=0, oom_above=3)
    )
    settings = BatcherSettings(max_batch_size=4, max_wait_ms=0, max_batch_tokens=None,
                               max_queue=10)  # fmt: skip
    batcher = Batcher("embedder", model.embed_batch, settings, Metrics().for_model("embedder"))
    batcher.start()
    try:
        deadline = asyncio.get_running_loop().time() + 60
        items = [batcher.submit(str(i), 1, Priority.ONLINE, deadline) for i in range(4)]
        await asyncio.gather(*(item.future for item in items))
    finally:
        await batcher.stop()
    backoffs = [e for e in _events(caplog) if e["event"] == "oom_backoff"]
    assert backoffs == [
        {"event": "oom_backoff", "model": "embedder", "batch_size": 4, "new_cap": 2}
    ]
    (record,) = [
        r for r in caplog.records if getattr(r, "fields", {}).get("event") == "oom_backoff"
    ]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "model embedder out of memory at batch 4; cap now 2"
