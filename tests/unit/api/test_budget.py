"""Monthly budgets over HTTP: a tenant whose month's cost reached its budget gets 429
insufficient_quota on model requests; other tenants and other routes are unaffected."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from conveyor.api.app import create_app
from conveyor.api.gateway_app import create_gateway_app
from conveyor.config.settings import ServerConfig
from conveyor.gateway.process import GatewaySettings
from conveyor.stores import open_job_store
from conveyor.stores.tenant_records import UsageRow
from conveyor.tenants.budget import month_start_s

pytestmark = pytest.mark.anyio

KEYS = {"a": "sk-test-tenant-a", "b": "sk-test-tenant-b"}


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path),
        "models": [{"name": "syn", "kind": "synthetic"}],
        "api_keys": [{"key": KEYS["a"], "tenant": "a"}, {"key": KEYS["b"], "tenant": "b"}],
        "tenants": [{"name": "a", "budget_usd": 5}, {"name": "b", "budget_usd": 5}],
    })  # fmt: skip
    app = create_app(config)
    async with app.router.lifespan_context(app):
        yield app


async def test_a_tenant_over_its_budget_gets_insufficient_quota(app: FastAPI) -> None:
    store = app.state.jobs.context.store.blocking
    month_s = month_start_s(time.time())
    store.add_usage([UsageRow("a", "syn", month_s, 1, 10, 0, 3600.0, 5.0),
                     UsageRow("b", "syn", month_s - 60, 1, 10, 0, 3600.0, 50.0),
                     UsageRow("b", "syn", month_s, 1, 10, 0, 3600.0, 4.99)])  # fmt: skip
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        body = {"model": "syn", "input": "hello"}
        refused = await client.post("/v1/embeddings", json=body, headers=auth("a"))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "insufficient_quota" and error["type"] == "insufficient_quota"
        # b spent 50 last month but 4.99 this month: under its budget.
        served = await client.post("/v1/embeddings", json=body, headers=auth("b"))
        assert served.status_code == 200, served.text
        assert (await client.get("/v1/models", headers=auth("a"))).status_code == 200
        metrics = (await client.get("/metrics", headers=auth("a"))).text
        assert 'conveyor_budget_refusals_total{tenant="a"} 1.0' in metrics
        assert 'conveyor_budget_refusals_total{tenant="b"}' not in metrics


async def test_a_gateway_refuses_a_tenant_over_its_budget(tmp_path: Path) -> None:
    """The gateway reads the same ledger: over budget is 429 before any routing."""
    store_url = f"sqlite://{tmp_path}/jobs.sqlite"
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path),
        "api_keys": [{"key": KEYS["a"], "tenant": "a"}, {"key": KEYS["b"], "tenant": "b"}],
        "tenants": [{"name": "a", "budget_usd": 5}, {"name": "b", "budget_usd": 5}],
    })  # fmt: skip
    store = open_job_store(store_url)
    app = create_gateway_app(GatewaySettings(store_url=store_url), config, store=store)
    async with app.router.lifespan_context(app):
        month_s = month_start_s(time.time())
        app.state.jobs.context.store.blocking.add_usage(
            [UsageRow("a", "syn", month_s, 1, 10, 0, 3600.0, 5.0)]
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for path, body in (
                ("/v1/embeddings", {"model": "syn", "input": "hello"}),
                ("/v1/chat/completions", {"model": "syn", "messages": []}),
                ("/v1/rerank", {"model": "syn", "query": "q", "documents": ["d"]}),
            ):
                refused = await client.post(path, json=body, headers=auth("a"))
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "insufficient_quota"
            # b is under its budget: past the check, to routing (no worker hosts syn).
            routed = await client.post("/v1/embeddings", json=body, headers=auth("b"))
            assert routed.status_code != 429, routed.text
