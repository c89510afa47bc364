"""A gateway's residency check and failover ramp, on a real (SQLite) worker registry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor.errors import QueueFull, ServiceUnavailable
from conveyor.fleet.failover import FailoverSettings
from conveyor.gateway.process import Gateway, GatewaySettings
from conveyor.gateway.status import fleet_document
from conveyor.stores import open_job_store

pytestmark = pytest.mark.anyio


async def test_residency_and_the_ramp_follow_the_registry(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/jobs.sqlite"
    store = open_job_store(url)
    now = time.time()
    store.upsert_worker("eu1", "http://eu1:1", ["m"], 8, {"region": "eu"}, now)
    store.upsert_worker("us1", "http://us1:1", ["m"], 8, {"region": "us"}, now)
    settings = GatewaySettings(store_url=url, failover=FailoverSettings(ramp_s=60))
    gateway = Gateway(settings, store, tenant_regions={"resident": frozenset({"eu"})})
    await gateway.start()
    try:
        assert gateway.check_residency("resident", "m") == {"eu"}
        assert gateway.check_residency("anyone", "m") is None
        gateway.admit_failover("m")  # both regions up: no ramp
        assert {w["region"] for w in fleet_document(gateway)["workers"]} == {"eu", "us"}
        store.remove_worker("eu1")  # the eu region is gone
        await gateway.registry.refresh()
        gateway.on_refresh()
        with pytest.raises(ServiceUnavailable) as refused:
            gateway.check_residency("resident", "m")
        assert refused.value.code == "no_worker_in_region"
        assert gateway.check_residency("anyone", "m") is None
        doc = fleet_document(gateway)["failover"]
        assert doc["is_ramping"] and doc["lost_regions"] == ["eu"]
        with pytest.raises(QueueFull) as limited:  # past the first second's allowance
            for _ in range(100):
                gateway.admit_failover("m")
        assert limited.value.code == "failover_ramp" and limited.value.retry_after_s >= 1
    finally:
        await gateway.stop()
