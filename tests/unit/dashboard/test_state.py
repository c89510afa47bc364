"""The dashboard's state document and page routes, in-process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram

from conveyor.api.app import create_app
from conveyor.api.gateway_app import create_gateway_app
from conveyor.config import ServerConfig
from conveyor.dashboard.metrics_read import MetricReader
from conveyor.gateway import GatewaySettings
from conveyor.stores import open_job_store

pytestmark = pytest.mark.anyio

SYN = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 1, "max_wait_ms": 1, "dim": 4}
KEY = "tenant-a-key-123"


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def _config(tmp_path: Path, **extra: Any) -> ServerConfig:
    return ServerConfig.model_validate({"models": [SYN], "data_dir": str(tmp_path), **extra})


async def test_the_state_shows_what_the_model_did(tmp_path: Path) -> None:
    app = create_app(_config(tmp_path))
    async with app.router.lifespan_context(app), _client(app) as client:
        for _ in range(4):
            answer = await client.post("/v1/embeddings", json={"model": "syn", "input": ["a", "b"]})
            assert answer.status_code == 200
        await app.state.service.ledger.flush()  # online usage is written every second
        state = (await client.get("/v1/dashboard/state")).json()
    assert state["object"] == "dashboard.state" and state["role"] == "serve"
    assert state["viewer"] == {"tenant": "default", "scope": "all"}
    (model,) = state["models"]
    assert model["name"] == "syn" and model["kind"] == "one-shot"
    assert model["totals"]["inputs"] == 8 and model["totals"]["requests"]["ok"] == 4
    assert model["queue_depth"] == {"online": 0, "batch": 0}
    assert model["config"] == {"max_batch_size": 32, "max_wait_ms": 1.0}
    assert model["histograms"]["latency_s"][-1] == [None, 4]
    assert model["plan"]["inputs_per_s_per_replica"] > 0
    assert state["jobs"] == [] and state["fleet"] is None
    assert state["tenants"]["available"] is True
    (usage,) = state["tenants"]["usage"]
    assert (usage["tenant"], usage["requests"], usage["input_tokens"]) == ("default", 4, 8)


async def test_the_state_needs_a_key_and_the_page_does_not(tmp_path: Path) -> None:
    app = create_app(_config(tmp_path, api_keys=[{"key": KEY, "tenant": "a"}]))
    async with app.router.lifespan_context(app), _client(app) as client:
        assert (await client.get("/v1/dashboard/state")).status_code == 401
        keyed = await client.get("/v1/dashboard/state", headers={"authorization": f"Bearer {KEY}"})
        page = await client.get("/dashboard")
        script = await client.get("/dashboard/vendor/uPlot.iife.min.js")
        other = await client.get("/dashboard/index.html")
    assert keyed.status_code == 200 and keyed.json()["viewer"] == {"tenant": "a", "scope": "tenant"}
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    assert script.status_code == 200 and script.text.startswith(
        "/*! https://github.com/leeoniya/uPlot"
    )
    assert other.status_code == 404


async def test_the_gateway_state_has_the_fleet(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/jobs.sqlite"
    store = open_job_store(url)
    store.upsert_worker("w1", "http://127.0.0.1:9", ["syn"], 8, {"models": {}}, time.time())
    app = create_gateway_app(GatewaySettings(store_url=url), _config(tmp_path), store=store)
    async with app.router.lifespan_context(app), _client(app) as client:
        state = (await client.get("/v1/dashboard/state")).json()
    assert state["role"] == "gateway"
    assert [w["id"] for w in state["fleet"]["workers"]] == ["w1"]
    assert "syn" in state["fleet"]["models"]


def test_histograms_read_back_with_an_infinite_top() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("x_seconds", "x", ["model"], buckets=(0.1, 1.0), registry=registry)
    histogram.labels("m").observe(0.5)
    assert MetricReader(registry).histogram("x_seconds", "m") == [[0.1, 0], [1.0, 1], [None, 1]]
