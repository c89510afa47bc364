"""A store outage makes every worker's row look stale: the gateway answers 503, not 404.

A fake store that goes down on request and a settable clock replay the outage exactly.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from conveyor.errors import ModelNotFound, ServiceUnavailable
from conveyor.fakes import MemoryJobStore
from conveyor.gateway.process import Gateway, GatewaySettings
from conveyor.gateway.proxy import ProxyApp
from conveyor.stores.errors import StoreUnavailableError
from conveyor.stores.records import WorkerRecord

pytestmark = pytest.mark.anyio

STALE_AFTER_S = 3.0
REAP_AFTER_S = 30.0


class Clock:
    """A settable wall clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class OutageStore(MemoryJobStore):
    """The in-memory registry, unreachable while `is_down`."""

    def __init__(self) -> None:
        super().__init__()
        self.is_down = False

    def list_workers(self, now: float, stale_after_s: float) -> list[WorkerRecord]:
        if self.is_down:
            raise StoreUnavailableError("the store is unreachable")
        return super().list_workers(now, stale_after_s)

    def remove_worker(self, worker_id: str) -> bool:
        if self.is_down:
            raise StoreUnavailableError("the store is unreachable")
        return super().remove_worker(worker_id)


def beat(store: OutageStore, at: float, worker_id: str = "w1") -> None:
    """A heartbeat of a worker hosting `m`, at `at`."""
    store.upsert_worker(worker_id, "http://127.0.0.1:9", ["m"], 8, {}, at)


def gateway_on(store: OutageStore, clock: Clock) -> Gateway:
    settings = GatewaySettings(
        store_url="unused", stale_after_s=STALE_AFTER_S, reap_after_s=REAP_AFTER_S
    )
    return Gateway(settings, store, clock=clock)


async def outage(gateway: Gateway, store: OutageStore, clock: Clock, length_s: float) -> None:
    """The store goes down for `length_s` (the gateway's reads fail) and comes back."""
    store.is_down = True
    clock.now += length_s
    with pytest.raises(StoreUnavailableError):
        await gateway.registry.refresh()
    store.is_down = False


async def test_after_an_outage_a_served_model_gets_503_until_its_worker_beats() -> None:
    store, clock = OutageStore(), Clock()
    gateway = gateway_on(store, clock)
    beat(store, clock.now)
    await gateway.registry.refresh()
    gateway.check_model("m")
    assert not gateway.registry.is_unsure()
    await outage(gateway, store, clock, length_s=10)
    assert gateway.registry.is_unsure()
    gateway.check_model("m")  # the last view stands while the store is unreachable
    await gateway.registry.refresh()  # back: w1's last beat is 10 s old, stale
    assert gateway.registered_models() == set()
    with pytest.raises(ServiceUnavailable) as unsure:
        gateway.check_model("m")
    assert unsure.value.code == "registry_unsure" and unsure.value.headers()["Retry-After"]
    with pytest.raises(ModelNotFound):
        gateway.check_model("never-hosted")
    clock.now += 0.5
    beat(store, clock.now)  # the worker's heartbeats get through again
    await gateway.registry.refresh()
    gateway.check_model("m")


async def test_a_worker_still_silent_once_the_registry_is_sure_again_is_gone() -> None:
    store, clock = OutageStore(), Clock()
    gateway = gateway_on(store, clock)
    beat(store, clock.now)
    await gateway.registry.refresh()
    await outage(gateway, store, clock, length_s=10)
    await gateway.registry.refresh()
    clock.now += STALE_AFTER_S  # every live worker has beaten since the store came back
    await gateway.registry.refresh()
    assert not gateway.registry.is_unsure()
    with pytest.raises(ModelNotFound):
        gateway.check_model("m")


async def test_rows_silent_through_a_long_outage_are_not_reaped_on_its_return() -> None:
    store, clock = OutageStore(), Clock()
    gateway = gateway_on(store, clock)
    beat(store, clock.now)
    await gateway.registry.refresh()
    await outage(gateway, store, clock, length_s=REAP_AFTER_S * 2)
    await gateway.registry.refresh()
    assert [r.worker_id for r in store.list_workers(clock.now, STALE_AFTER_S)] == ["w1"]
    with pytest.raises(ServiceUnavailable):
        gateway.check_model("m")
    clock.now += STALE_AFTER_S
    await gateway.registry.refresh()  # sure again: the long-silent row is reaped now
    assert store.list_workers(clock.now, STALE_AFTER_S) == []


async def test_a_registry_never_read_answers_503_not_404() -> None:
    store, clock = OutageStore(), Clock()
    store.is_down = True
    gateway = gateway_on(store, clock)
    with pytest.raises(StoreUnavailableError):
        await gateway.registry.refresh()
    with pytest.raises(ServiceUnavailable):
        gateway.check_model("m")


async def test_the_gateway_answers_an_unsure_registry_s_503_with_retry_after() -> None:
    store, clock = OutageStore(), Clock()
    gateway = gateway_on(store, clock)
    beat(store, clock.now)
    await gateway.registry.refresh()
    await outage(gateway, store, clock, length_s=10)
    await gateway.registry.refresh()
    transport = httpx.ASGITransport(app=ProxyApp(gateway))
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as client:
        body: dict[str, Any] = {"model": "m", "input": "x"}
        answer = await client.post("/v1/embeddings", json=body)
        unknown = await client.post("/v1/embeddings", json={**body, "model": "nope"})
    assert answer.status_code == 503 and int(answer.headers["retry-after"]) >= 1
    assert answer.json()["error"]["code"] == "registry_unsure"
    assert unknown.status_code == 404


async def test_a_batch_for_a_served_model_is_not_refused_while_the_registry_is_unsure() -> None:
    store, clock = OutageStore(), Clock()
    gateway = gateway_on(store, clock)
    beat(store, clock.now)
    await gateway.registry.refresh()
    assert gateway.may_serve_batch_lines("m")
    await outage(gateway, store, clock, length_s=10)
    await gateway.registry.refresh()  # back, w1's row stale: unsure, not "not served"
    assert gateway.may_serve_batch_lines("m")
    assert not gateway.may_serve_batch_lines("never-hosted")
    clock.now += STALE_AFTER_S  # sure again, and w1 never came back
    await gateway.registry.refresh()
    assert not gateway.may_serve_batch_lines("m")
