"""``conveyor_fleet_workers`` counts the workers hosting each model, by routing state."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor.gateway.process import Gateway, GatewaySettings
from conveyor.stores import open_job_store

pytestmark = pytest.mark.anyio


async def test_workers_are_counted_per_model(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/jobs.sqlite"
    store = open_job_store(url)
    now = time.time()
    store.upsert_worker("w1", "http://w1:1", ["a"], 8, {}, now)
    store.upsert_worker("w2", "http://w2:1", ["a", "b"], 8, {"is_draining": True}, now)
    gateway = Gateway(GatewaySettings(store_url=url), store)
    await gateway.start()
    try:
        registry = gateway.metrics.registry

        def workers(model: str, state: str) -> float | None:
            labels = {"model": model, "state": state}
            return registry.get_sample_value("conveyor_fleet_workers", labels)

        assert workers("a", "routable") == 1 and workers("a", "draining") == 1
        assert workers("b", "routable") == 0 and workers("b", "draining") == 1
        store.remove_worker("w2")
        await gateway.registry.refresh()
        gateway.on_refresh()
        assert workers("b", "draining") is None and workers("a", "draining") == 0
    finally:
        await gateway.stop()
