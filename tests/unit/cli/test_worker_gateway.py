"""Worker drain gate and load report; gateway request parsing, demands and fleet document."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from conveyor.cli.worker import (
    DrainGate,
    WorkerSettings,
    advertised_address,
    parse_listen,
    service_load,
)
from conveyor.config.settings import ServerConfig
from conveyor.errors import InvalidRequest
from conveyor.gateway.process import Gateway, GatewaySettings
from conveyor.gateway.sniff import parse_model
from conveyor.gateway.status import fleet_document
from conveyor.host.service import Service
from conveyor.stores import JobStore, open_job_store

pytestmark = pytest.mark.anyio


class Held:
    """An ASGI app whose /v1 responses wait for ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"].startswith("/v1/"):
            self.started.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def test_drain_refuses_new_work_and_waits_for_in_flight() -> None:
    held = Held()
    gate = DrainGate(held)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gate), base_url="http://w"
    ) as client:
        pending = asyncio.create_task(client.post("/v1/embeddings"))
        await asyncio.wait_for(held.started.wait(), 5)
        assert gate.num_in_flight == 1
        drained = asyncio.create_task(gate.drain(timeout_s=5))
        await asyncio.sleep(0.01)
        assert not drained.done()
        refused = await client.post("/v1/embeddings")
        assert refused.status_code == 503 and "draining" in refused.text
        assert (await client.get("/ready")).status_code == 503
        assert (await client.get("/health")).status_code == 200
        held.release.set()
        assert (await pending).status_code == 200
        assert await drained is True
        assert gate.num_in_flight == 0


async def test_drain_gives_up_after_its_timeout() -> None:
    held = Held()
    gate = DrainGate(held)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gate), base_url="http://w"
    ) as client:
        pending = asyncio.create_task(client.post("/v1/x"))
        await asyncio.wait_for(held.started.wait(), 5)
        assert await gate.drain(timeout_s=0.01) is False
        held.release.set()
        await pending


async def test_service_load_reports_every_model() -> None:
    config = ServerConfig.model_validate(
        {"models": [{"name": "syn", "kind": "synthetic", "batch_latency_ms": 0}]}
    )
    async with Service(config) as service:
        gate = DrainGate(Held())
        report = service_load(service, gate)
    assert report["in_flight"] == 0 and report["is_draining"] is False
    assert report["models"]["syn"]["queue_depth"] == 0
    assert report["models"]["syn"]["is_loaded"] is True


def test_listen_and_advertise() -> None:
    assert parse_listen("127.0.0.1:8001") == ("127.0.0.1", 8001)
    assert parse_listen("[::1]:9") == ("::1", 9)
    for bad in ("8001", "host:", "host:port"):
        with pytest.raises(ValueError):
            parse_listen(bad)
    settings = WorkerSettings(store_url="sqlite://x", host="10.0.0.5")
    assert advertised_address(settings, 8001) == "http://10.0.0.5:8001"
    pinned = WorkerSettings(store_url="sqlite://x", advertise="http://pod:8001/")
    assert advertised_address(pinned, 1) == "http://pod:8001"
    with pytest.raises(ValueError):
        WorkerSettings(store_url="x", heartbeat_s=0)


def test_parse_model_reads_model_and_input_count() -> None:
    assert parse_model(b'{"model": "m", "input": ["a", "b", "c"]}') == ("m", 3)
    assert parse_model(b'{"model": "m", "input": "a"}') == ("m", 1)
    assert parse_model(b'{"model": "m", "input": [1, 2, 3]}') == ("m", 1)  # one token list
    assert parse_model(b'{"model": "m", "messages": []}') == ("m", 1)
    for bad in (b"not json", b"[1]", b'{"input": "a"}', b'{"model": 3}'):
        with pytest.raises(InvalidRequest):
            parse_model(bad)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    opened = open_job_store(f"sqlite://{tmp_path}/jobs.sqlite")
    yield opened
    opened.close()


async def test_gateway_demands_and_fleet_document(store: JobStore) -> None:
    import time

    now = time.time()
    for worker_id, depth, rate in (("a", 4, 100.0), ("b", 6, 300.0)):
        models = {"m": {"queue_depth": depth, "service_per_s": rate}}
        store.upsert_worker(worker_id, f"http://{worker_id}", ["m"], 8, {"models": models}, now)
    gateway = Gateway(GatewaySettings(store_url="unused", target_utilisation=0.5), store)
    await gateway.registry.refresh()
    gateway.on_refresh()
    gateway.count_arrival("m", 50)
    (demand,) = gateway.demands()
    assert demand.queue_depth == 10 and demand.num_replicas == 2
    assert demand.service_per_s_per_replica == 200.0
    assert demand.arrival_per_s == pytest.approx(50 / gateway.settings.arrival_window_s)
    doc = fleet_document(gateway)
    assert [w["id"] for w in doc["workers"]] == ["a", "b"]
    assert all(w["is_routable"] for w in doc["workers"])
    assert doc["models"]["m"]["desired_replicas"] == 1  # 5/s / 200/s / 0.5, rounded up
    assert gateway.healthy_models() == ["m"]
    assert (
        gateway.metrics.registry.get_sample_value("conveyor_fleet_queue_depth", {"model": "m"})
        == 10
    )


def test_gateway_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        GatewaySettings(store_url="x", stale_after_s=0)
    with pytest.raises(ValueError):
        GatewaySettings(store_url="x", stale_after_s=10, reap_after_s=5)
    with pytest.raises(ValueError):
        GatewaySettings(store_url="x", target_utilisation=0)
