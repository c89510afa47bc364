"""A worker refuses a model call of a tenant pinned to other regions (503, so a gateway tries
another worker), whether the call came straight or through a gateway that lacks the pin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from conveyor.api.app import create_app
from conveyor.api.auth import ApiKeyMiddleware
from conveyor.api.residency import NOT_RESIDENT_CODE, Residency, ResidencyMiddleware
from conveyor.config.settings import ServerConfig
from conveyor.fleet.credential import FleetCredential, credential_from
from conveyor.tenants.keyring import KeyRing
from tests.unit.api.test_auth_fleet import FLEET_KEY, fleet

pytestmark = pytest.mark.anyio
PINS = {"acme": ("eu",), "globex": ("us", "ap")}
EMBED = {"model": "syn", "input": "hello"}


async def ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ran"})


def worker_in(region: str | None) -> httpx.AsyncClient:
    """A client of ``ok`` behind a fleet worker's key check and residency in ``region``."""
    inner = ResidencyMiddleware(ok, Residency(region, PINS))
    keys = ApiKeyMiddleware(inner, KeyRing({}, requires_keys=True),
                            fleet=FleetCredential(FLEET_KEY.encode()))  # fmt: skip
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=keys), base_url="http://w")


@pytest.mark.parametrize(
    ("region", "tenant", "status"),
    [
        ("eu", "acme", 200),
        ("eu", "globex", 503),
        ("ap", "globex", 200),
        ("eu", "unpinned", 200),
        (None, "acme", 503),  # an unlabelled worker is in none of a tenant's regions
        (None, "unpinned", 200),
    ],
)
async def test_a_model_call_runs_only_in_the_tenants_regions(
    region: str | None, tenant: str, status: int
) -> None:
    async with worker_in(region) as client:
        answer = await client.post("/v1/embeddings", json=EMBED, headers=fleet(tenant))
    assert answer.status_code == status
    if status == 503:
        assert answer.json()["error"]["code"] == NOT_RESIDENT_CODE
        assert tenant in answer.json()["error"]["message"]
        assert "x-conveyor-draining" not in answer.headers  # the worker stays routable


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("GET", "/v1/files"), ("POST", "/v1/files"),
     ("POST", "/v1/batches"), ("POST", "/tokenize")],
)  # fmt: skip
async def test_what_runs_no_model_passes_for_a_tenant_pinned_elsewhere(
    method: str, path: str
) -> None:
    async with worker_in("eu") as client:
        answer = await client.request(method, path, headers=fleet("globex"))
    assert answer.status_code == 200


async def test_a_fleet_worker_app_refuses_a_tenant_pinned_elsewhere(tmp_path: Path) -> None:
    config = ServerConfig.model_validate({
        "data_dir": str(tmp_path),
        "models": [{"name": "syn", "kind": "synthetic", "batch_latency_ms": 0, "dim": 4}],
        "fleet": {"internal_key": FLEET_KEY},
        "tenants": [{"name": tenant, "regions": list(regions)} for tenant, regions in PINS.items()],
        "jobs": {"region": "eu", "region_object_store_urls": {
            region: str(tmp_path / region) for region in ("eu", "us")}},
    })  # fmt: skip
    app = create_app(config, fleet_credential=credential_from(config.fleet),
                     residency=Residency(config.jobs.region, config.tenancy.regions))  # fmt: skip
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            answers: dict[str, Any] = {
                tenant: await client.post("/v1/embeddings", json=EMBED, headers=fleet(tenant))
                for tenant in ("acme", "globex", "unpinned")
            }
    assert {t: a.status_code for t, a in answers.items()} == {
        "acme": 200, "globex": 503, "unpinned": 200,
    }  # fmt: skip
    assert answers["globex"].json()["error"]["code"] == NOT_RESIDENT_CODE
