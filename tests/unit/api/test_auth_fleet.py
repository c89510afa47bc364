"""A worker with the fleet key: its gateways' callers by the vouched tenant, its own keys by
theirs; a tenant header never moves a request to another tenant without the fleet key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from conveyor.api.app import create_app
from conveyor.api.auth import ApiKeyMiddleware, static_principals
from conveyor.config.settings import ApiKey, ServerConfig
from conveyor.fleet.credential import FleetCredential, credential_from
from conveyor.host.service import Service
from conveyor.tenants.keyring import KeyRing

pytestmark = pytest.mark.anyio

FLEET_KEY = "fleet-key-0123456789abcdef"
OWN_KEY = "sk-worker-0123456789"


async def principal_echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer 200 with the tenant and admin flag the middleware found."""
    principal = scope["state"]["principal"]
    body = f"{principal.tenant}:{principal.is_admin}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def guarded(own_keys: list[ApiKey]) -> httpx.AsyncClient:
    """A client of `principal_echo` behind a worker's key check with the fleet key."""
    keyring = KeyRing(static_principals(own_keys), requires_keys=True)
    middleware = ApiKeyMiddleware(
        principal_echo, keyring, fleet=FleetCredential(FLEET_KEY.encode())
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware), base_url="http://w")


def fleet(tenant: str | None = None, **extra: str) -> dict[str, str]:
    """The headers a gateway sends: the fleet key and (unless None) the tenant."""
    headers = {"Authorization": f"Bearer {FLEET_KEY}", **extra}
    return headers if tenant is None else {**headers, "X-Conveyor-Tenant": tenant}


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (fleet("acme"), "acme:False"),
        (fleet("Acme%20EU", **{"X-Conveyor-Tenant-Admin": "1"}), "Acme EU:True"),
        # The worker's own key says who the caller is, whatever the headers claim.
        ({"Authorization": f"Bearer {OWN_KEY}", "X-Conveyor-Tenant": "acme"}, "ops:False"),
        (
            {"Authorization": f"Bearer {OWN_KEY}", "X-Conveyor-Tenant-Admin": "1"},
            "ops:False",
        ),
    ],
)
async def test_the_fleet_key_vouches_and_an_own_key_speaks_for_itself(
    headers: dict[str, str], expected: str
) -> None:
    async with guarded([ApiKey(key=OWN_KEY, tenant="ops")]) as client:
        answer = await client.get("/v1/models", headers=headers)
    assert (answer.status_code, answer.text) == (200, expected)


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no keys of its own, yet not open: the fleet key is one
        {"X-Conveyor-Tenant": "acme"},
        {"Authorization": "Bearer not-the-fleet-key-0123", "X-Conveyor-Tenant": "acme"},
        fleet(),  # the fleet key, but for no one
        {"Authorization": f"Bearer {FLEET_KEY}", "X-Conveyor-Tenant": "%ff"},
    ],
)
async def test_a_worker_with_the_fleet_key_refuses_everyone_else(headers: dict[str, str]) -> None:
    async with guarded([]) as client:
        answer = await client.get("/v1/models", headers=headers)
        health = await client.get("/health")
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    assert health.status_code == 200


def worker_config(tmp_path: Path) -> ServerConfig:
    models = [{"name": "syn", "kind": "synthetic", "batch_latency_ms": 0, "dim": 4}]
    return ServerConfig.model_validate(
        {
            "data_dir": str(tmp_path),
            "models": models,
            "api_keys": [{"key": OWN_KEY, "tenant": "ops"}],
            "fleet": {"internal_key": FLEET_KEY},
        }
    )


@asynccontextmanager
async def worker_for(config: ServerConfig) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    """A client of a started worker app with the fleet key, and its service."""
    app = create_app(config, fleet_credential=credential_from(config.fleet))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            yield client, app.state.service


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    """A worker with keys of its own and the fleet key."""
    async with worker_for(worker_config(tmp_path)) as started:
        yield started


def input_tokens(service: Service, tenant: str) -> float:
    labels = {"tenant": tenant, "model": "syn", "kind": "input"}
    return service.metrics.registry.get_sample_value("conveyor_tokens_total", labels) or 0.0


async def test_a_vouched_request_is_billed_to_its_tenant_and_a_spoof_to_the_key_s(
    worker: tuple[httpx.AsyncClient, Service],
) -> None:
    client, service = worker
    body: dict[str, Any] = {"model": "syn", "input": "hello"}
    vouched = await client.post("/v1/embeddings", json=body, headers=fleet("acme"))
    spoofed = await client.post(
        "/v1/embeddings",
        json=body,
        headers={"Authorization": f"Bearer {OWN_KEY}", "X-Conveyor-Tenant": "victim"},
    )
    keyless = await client.post("/v1/embeddings", json=body, headers={"X-Conveyor-Tenant": "v"})
    assert (vouched.status_code, spoofed.status_code, keyless.status_code) == (200, 200, 401)
    assert input_tokens(service, "acme") > 0 and input_tokens(service, "ops") > 0
    assert input_tokens(service, "victim") == 0 and input_tokens(service, "v") == 0


async def test_a_worker_without_keys_of_its_own_is_not_open_with_the_fleet_key(
    tmp_path: Path,
) -> None:
    config = worker_config(tmp_path).model_copy(update={"api_keys": []})
    async with worker_for(config) as (client, _):
        anyone = await client.get("/v1/dashboard/state")
        vouched = await client.get("/v1/dashboard/state", headers=fleet("acme"))
    assert anyone.status_code == 401
    # The dashboard shows a vouched caller its own tenant's usage, not every tenant's.
    assert vouched.status_code == 200
    assert vouched.json()["viewer"] == {"tenant": "acme", "scope": "tenant"}
