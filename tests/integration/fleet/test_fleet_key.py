"""The fleet key between real processes: a key from `conveyor keys create` works through a
gateway on a worker that has keys of its own, is billed to its tenant, and no header a
client sends (to the gateway or to the worker) moves a request to another tenant."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.fleet.conftest import MODEL, SYNTHETIC, Fleet, Proc
from tests.integration.fleet.test_tenant_limits import create_key
from tests.polling import until

pytestmark = pytest.mark.postgres

FLEET_KEY = "fleet-key-0123456789abcdef"
WORKER_KEY = "sk-worker-only-0123456789"
SPOOF = {"X-Conveyor-Tenant": "victim", "X-Conveyor-Tenant-Admin": "1"}


def billed(worker: Proc, tenant: str) -> float:
    """Input tokens the worker billed to `tenant`."""
    return worker.metric("conveyor_tokens_total", tenant=tenant, model=MODEL, kind="input")


def embed(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/v1/embeddings", json={"model": MODEL, "input": "x"},
                      headers=headers, timeout=10)  # fmt: skip


def test_a_stored_key_works_through_a_gateway_on_a_worker_with_keys(
    fleet: Fleet, store_url: str, tmp_path: Path
) -> None:
    key = create_key(store_url, "acme")
    worker = fleet.start_worker(
        "w1",
        config={
            "models": [SYNTHETIC],
            "api_keys": [{"key": WORKER_KEY, "tenant": "ops"}],
            "fleet": {"internal_key": FLEET_KEY},
        },
    )
    gateway_yaml = tmp_path / "gateway.yaml"
    gateway_yaml.write_text(yaml.safe_dump({"fleet": {"internal_key": FLEET_KEY}}))
    gateway = fleet.start_gateway(extra_args=("--config", str(gateway_yaml)))
    auth = {"Authorization": f"Bearer {key}"}

    def is_routable() -> bool:
        doc = httpx.get(f"{gateway.url}/v1/fleet", headers=auth, timeout=5).json()
        return [w["is_routable"] for w in doc["workers"]] == [True]

    until(is_routable, "w1 routable", timeout_s=10)

    through = embed(gateway.url, {**auth, **SPOOF})
    assert through.status_code == 200, through.text
    assert billed(worker, "acme") > 0 and billed(worker, "victim") == 0
    assert embed(gateway.url, SPOOF).status_code == 401  # a gateway with stored keys is closed

    # Straight at the worker: its own key is its own tenant's; a tenant header alone is nothing.
    direct = embed(worker.url, {"Authorization": f"Bearer {WORKER_KEY}", **SPOOF})
    assert direct.status_code == 200 and billed(worker, "ops") > 0
    assert embed(worker.url, SPOOF).status_code == 401
    assert embed(worker.url, auth).status_code == 401  # stored keys are the gateway's
    assert billed(worker, "victim") == 0
    assert FLEET_KEY not in worker.log() + gateway.log()
