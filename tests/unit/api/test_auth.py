"""API keys: the Bearer scheme in any case, keys given by hash, and /metrics protection."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from conveyor.api.app import create_app
from conveyor.api.auth import ApiKeyMiddleware, static_principals
from conveyor.api.gateway_app import create_gateway_app
from conveyor.config.settings import ApiKey, ServerConfig
from conveyor.gateway.process import GatewaySettings
from conveyor.stores import open_job_store
from conveyor.tenants.keyring import KeyRing
from conveyor.tenants.keys import bearer_token

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789"
KEY_SHA256 = hashlib.sha256(KEY.encode()).hexdigest()


async def tenant_echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer 200 with the tenant the middleware found."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": scope["state"]["tenant"].encode()})


def client_for(app: Callable[[Scope, Receive, Send], object]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (b"Bearer abc", b"abc"),
        (b"bearer abc", b"abc"),
        (b"BEARER   abc  ", b"abc"),
        (b"  BeArEr abc", b"abc"),
        (b"Basic abc", None),
        (b"Bearerabc", None),
        (b"Bearer", None),
        (b"Bearer    ", None),
    ],
)
def test_bearer_token(header: bytes, token: bytes | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    "api_key", [ApiKey(key=KEY, tenant="a"), ApiKey(key_sha256=KEY_SHA256, tenant="a")]
)
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
async def test_a_key_in_either_form_is_accepted_with_any_case_of_scheme(
    api_key: ApiKey, scheme: str
) -> None:
    async with client_for(
        ApiKeyMiddleware(tenant_echo, KeyRing(static_principals([api_key])))
    ) as client:
        answer = await client.get("/v1/models", headers={"Authorization": f"{scheme}  {KEY} "})
    assert (answer.status_code, answer.text) == (200, "a")


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing API key"),
        ({"Authorization": f"Basic {KEY}"}, "incorrect API key provided"),
        ({"Authorization": "Bearer sk-wrong-0123456789"}, "incorrect API key provided"),
        # Knowing the configured hash is no key.
        ({"Authorization": f"Bearer {KEY_SHA256}"}, "incorrect API key provided"),
    ],
)
async def test_wrong_or_missing_keys_get_401(headers: dict[str, str], message: str) -> None:
    middleware = ApiKeyMiddleware(
        tenant_echo, KeyRing(static_principals([ApiKey(key_sha256=KEY_SHA256)]))
    )
    async with client_for(middleware) as client:
        answer = await client.get("/v1/models", headers=headers)
    assert answer.status_code == 401
    assert answer.json()["error"]["message"] == message


def server_app(config: ServerConfig, tmp_path: Path) -> FastAPI:
    return create_app(config)


def gateway_app(config: ServerConfig, tmp_path: Path) -> FastAPI:
    store = open_job_store(f"sqlite://{tmp_path}/jobs.sqlite")
    return create_gateway_app(GatewaySettings(store_url="unused"), config, store=store)


@pytest.mark.parametrize("make_app", [server_app, gateway_app])
async def test_metrics_need_a_key_only_with_metrics_auth(
    make_app: Callable[[ServerConfig, Path], FastAPI], tmp_path: Path
) -> None:
    keys = [{"key_sha256": KEY_SHA256}]
    base = {"data_dir": str(tmp_path), "models": [{"name": "syn", "kind": "synthetic"}]}
    open_app = make_app(ServerConfig.model_validate({**base, "api_keys": keys}), tmp_path)
    async with client_for(open_app) as client:
        assert (await client.get("/metrics")).status_code == 200
    guarded = ServerConfig.model_validate({**base, "api_keys": keys, "metrics_auth": True})
    async with client_for(make_app(guarded, tmp_path)) as client:
        assert (await client.get("/metrics")).status_code == 401
        good = await client.get("/metrics", headers={"Authorization": f"bearer {KEY}"})
        assert good.status_code == 200
        assert (await client.get("/health")).status_code == 200
