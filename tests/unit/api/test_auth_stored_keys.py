"""Keys from the job store: accepted, refused once revoked and reread, and 503 before a read."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from conveyor.api.auth import ApiKeyMiddleware, static_principals
from conveyor.config.settings import ApiKey
from conveyor.fakes import MemoryJobStore
from conveyor.stores import StoreError
from conveyor.tenants.keyring import KeyRing
from conveyor.tenants.keys import new_key_record
from tests.polling import until_async

pytestmark = pytest.mark.anyio


async def principal_echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answer 200 with the tenant and admin flag the middleware found."""
    principal = scope["state"]["principal"]
    body = f"{principal.tenant}:{principal.is_admin}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def client_for(app: Callable[[Scope, Receive, Send], object]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")  # type: ignore[arg-type]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_stored_key_works_until_revoked_and_reread() -> None:
    store = MemoryJobStore()
    key, rec = new_key_record("acme", is_admin=True)
    store.create_api_key(rec)
    keyring = KeyRing({}, store)
    keyring.load()
    async with client_for(ApiKeyMiddleware(principal_echo, keyring)) as client:
        answer = await client.get("/v1/models", headers=bearer(key))
        assert (answer.status_code, answer.text) == (200, "acme:True")
        store.revoke_api_key(rec.id, time.time())
        assert (await client.get("/v1/models", headers=bearer(key))).status_code == 200
        await keyring.refresh()
        answer = await client.get("/v1/models", headers=bearer(key))
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"


async def test_keys_are_enforced_while_only_revoked_keys_are_stored() -> None:
    store = MemoryJobStore()
    _, rec = new_key_record("acme")
    store.create_api_key(rec)
    store.revoke_api_key(rec.id, time.time())
    keyring = KeyRing({}, store)
    keyring.load()
    async with client_for(ApiKeyMiddleware(principal_echo, keyring)) as client:
        assert (await client.get("/v1/models")).status_code == 401


async def test_without_any_key_everyone_is_the_default_tenant() -> None:
    keyring = KeyRing({}, MemoryJobStore())
    keyring.load()
    async with client_for(ApiKeyMiddleware(principal_echo, keyring)) as client:
        answer = await client.get("/v1/models")
    assert (answer.status_code, answer.text) == (200, "default:False")


async def test_config_and_stored_keys_work_side_by_side() -> None:
    store = MemoryJobStore()
    key, rec = new_key_record("acme")
    store.create_api_key(rec)
    static = static_principals([ApiKey(key="sk-config-key-1", tenant="ops", admin=True)])
    keyring = KeyRing(static, store)
    keyring.load()
    async with client_for(ApiKeyMiddleware(principal_echo, keyring)) as client:
        assert (await client.get("/x", headers=bearer(key))).text == "acme:False"
        assert (await client.get("/x", headers=bearer("sk-config-key-1"))).text == "ops:True"


async def test_an_unreadable_store_answers_503_until_a_read_succeeds() -> None:
    store = MemoryJobStore()
    key, rec = new_key_record("acme")
    store.create_api_key(rec)
    failing = MemoryJobStore()
    failing.close()  # every call raises StoreError
    keyring = KeyRing({}, failing)
    keyring.load()
    async with client_for(ApiKeyMiddleware(principal_echo, keyring)) as client:
        answer = await client.get("/v1/models", headers=bearer(key))
        assert answer.status_code == 503
        assert (await client.get("/health")).status_code == 200
        with pytest.raises(StoreError):
            await keyring.refresh()
        keyring._store = store  # the store comes back
        await keyring.refresh()
        assert (await client.get("/v1/models", headers=bearer(key))).status_code == 200


async def test_use_is_written_back_on_the_next_reread() -> None:
    store = MemoryJobStore()
    key, rec = new_key_record("acme", now=0)
    store.create_api_key(rec)
    keyring = KeyRing({}, store)
    keyring.load()
    async with client_for(ApiKeyMiddleware(principal_echo, keyring)) as client:
        await client.get("/v1/models", headers=bearer(key))
    assert store.list_api_keys()[0].last_used_at is None
    await keyring.refresh()
    last_used_at = store.list_api_keys()[0].last_used_at
    assert last_used_at is not None and last_used_at >= int(time.time()) - 5


async def test_the_refresh_loop_rereads_every_refresh_s() -> None:
    store = MemoryJobStore()
    key, rec = new_key_record("acme")
    store.create_api_key(rec)
    keyring = KeyRing({}, store, refresh_s=0.01)
    keyring.load()
    await keyring.start()
    try:
        store.revoke_api_key(rec.id, time.time())
        await until_async(
            lambda: keyring.lookup(bytes.fromhex(rec.digest)) is None,
            "the revoked key to be reread", timeout_s=5, interval_s=0.01,
        )  # fmt: skip
    finally:
        await keyring.stop()
    assert key.startswith("sk-cv-")
