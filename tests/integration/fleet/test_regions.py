"""Two regions on one machine: a resident tenant stays in its region, the others fail over.

Region ``eu`` has two workers and a gateway, region ``us`` one worker and a gateway; each
region's synthetic model answers embeddings of its own length (4 in eu, 8 in us), so a
response tells where it ran. Tenant ``resident`` is pinned to ``eu``. Before the loss,
everything answers and the resident tenant's requests and batch lines all run in eu.
Then eu is killed: the resident tenant gets 503 (``no_worker_in_region``) and its new
batch waits, never run in us; the other tenant's traffic moves to us through the
failover ramp (429 with ``Retry-After`` beyond it), and every one of its requests is
answered in the end. The resident tenant's batch files are kept in eu's object store, and
a us worker called directly refuses the resident tenant too.
"""

from __future__ import annotations

import io
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e.test_batch_api import embedding_lines, jsonl, results
from tests.integration.fleet.conftest import SYNTHETIC, Fleet, Proc
from tests.integration.fleet.test_batch_fleet import JOBS, finished
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

KEYS = {"resident": "resident-key-0123456789", "roaming": "roaming-key-0123456789"}
RAMP_S = 4.0
NUM_LINES = 40


def config(dim: int) -> dict[str, Any]:
    """Keys, the pinned tenant and a synthetic model of embedding length ``dim``."""
    return {
        "models": [{**SYNTHETIC, "dim": dim}], "jobs": JOBS,
        "api_keys": [{"key": key, "tenant": tenant} for tenant, key in KEYS.items()],
        "tenants": [{"name": "resident", "regions": ["eu"]}],
    }  # fmt: skip


def fleet_doc(gateway: Proc) -> dict[str, Any]:
    """The gateway's ``GET /v1/fleet`` (it wants a key: the gateway has keys)."""
    headers = {"Authorization": f"Bearer {KEYS['roaming']}"}
    doc: dict[str, Any] = httpx.get(f"{gateway.url}/v1/fleet", headers=headers).json()
    return doc


def routable_ids(gateway: Proc) -> set[str]:
    """Ids of the workers the gateway would route to right now."""
    return {w["id"] for w in fleet_doc(gateway)["workers"] if w["is_routable"]}


def embed(client: httpx.Client, gateway: Proc, tenant: str) -> httpx.Response:
    """One embedding for ``tenant`` through ``gateway``."""
    return client.post(
        f"{gateway.url}/v1/embeddings", json={"model": "syn", "input": ["hello"]},
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
    )  # fmt: skip


def dim_of(response: httpx.Response) -> int:
    """The embedding length of a 200: 4 means eu served it, 8 us."""
    return len(response.json()["data"][0]["embedding"])


class RoamingLoad:
    """The roaming tenant's callers on us's gateway: on 429 they wait Retry-After and retry;
    every request's final status and the 429s seen are kept."""

    def __init__(self, gateway: Proc, num_threads: int = 4, per_thread: int = 25) -> None:
        self.gateway = gateway
        self.finals: list[tuple[int, int]] = []  # (status, dim or 0)
        self.retry_afters: list[int] = []
        self._threads = [
            threading.Thread(target=self._run, args=(per_thread,), daemon=True)
            for _ in range(num_threads)
        ]

    def run(self) -> None:
        for thread in self._threads:
            thread.start()
        for thread in self._threads:
            thread.join(timeout=120)

    def _run(self, count: int) -> None:
        with httpx.Client(timeout=10) as client:
            for _ in range(count):
                for _attempt in range(30):
                    response = embed(client, self.gateway, "roaming")
                    if response.status_code != 429:
                        break
                    self.retry_afters.append(int(response.headers["retry-after"]))
                    time.sleep(min(2.0, float(response.headers["retry-after"])))
                dim = dim_of(response) if response.status_code == 200 else 0
                self.finals.append((response.status_code, dim))


def start_region(fleet: Fleet, tmp_path: Path, region: str, names: str, dim: int) -> Proc:
    """The region's workers and its gateway (shared objects directories, its own config):
    the resident tenant's files go to eu's store, the others' to the default one."""
    path = tmp_path / f"{region}.yaml"
    path.write_text(yaml.safe_dump(config(dim)))
    objects = ("--objects", str(tmp_path / "objects"),
               "--region-objects", f"eu={tmp_path / 'objects-eu'}")  # fmt: skip
    for name in names:
        fleet.spawn_worker(name, config=config(dim), extra_args=(*objects, "--region", region))
    gateway_args = ("--config", str(path), *objects, "--region", region,
                    "--failover-ramp-s", str(RAMP_S))  # fmt: skip
    return fleet.start_gateway(f"gateway-{region}", extra_args=gateway_args)


def holds(directory: Path, data: bytes) -> bool:
    """Whether any object under ``directory`` holds ``data``."""
    return any(data in p.read_bytes() for p in directory.rglob("*") if p.is_file())


def resident_batch(gateway: Proc, tag: str) -> tuple[openai.OpenAI, Any]:
    """A batch of the resident tenant, submitted through ``gateway``."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEYS["resident"], max_retries=0)
    data = jsonl(embedding_lines(NUM_LINES, prefix=tag))
    uploaded = client.files.create(file=(f"{tag}.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    return client, batch


def test_a_lost_region_keeps_residents_home_and_ramps_the_others_over(
    fleet: Fleet, tmp_path: Path
) -> None:
    eu = start_region(fleet, tmp_path, "eu", "ab", dim=4)
    us = start_region(fleet, tmp_path, "us", "c", dim=8)
    for proc in fleet.procs:
        if proc.name in "abc":
            fleet.wait_ready(proc)
    until(lambda: routable_ids(us) == {"a", "b", "c"}, "both regions routable", timeout_s=15)
    with httpx.Client(timeout=10) as client:
        before = [embed(client, gateway, "resident") for gateway in (eu, us) for _ in range(10)]
        assert {(r.status_code, dim_of(r)) for r in before} == {(200, 4)}  # never us
        assert embed(client, us, "roaming").status_code == 200
        # Straight to us's worker, past every gateway: the worker refuses the resident too.
        direct = embed(client, next(p for p in fleet.procs if p.name == "c"), "resident")
        assert direct.status_code == 503
        assert direct.json()["error"]["code"] == "tenant_not_resident_here"
    eu_client, eu_batch = resident_batch(eu, "home")
    done = finished(eu_client, eu_batch.id)
    outputs, errors = results(eu_client, done)
    assert errors == [] and {
        len(o["response"]["body"]["data"][0]["embedding"]) for o in outputs
    } == {4}
    assert holds(tmp_path / "objects-eu", b"home-") and not holds(tmp_path / "objects", b"home-")

    for proc in fleet.procs:
        if proc.name in ("a", "b", "gateway-eu"):
            proc.process.send_signal(signal.SIGKILL)
    until(lambda: routable_ids(us) == {"c"}, "eu gone from us's routing", timeout_s=15)
    until(lambda: fleet_doc(us)["failover"]["is_ramping"], "the failover ramp", timeout_s=5)
    with httpx.Client(timeout=10) as client:
        refused = [embed(client, us, "resident") for _ in range(5)]
    assert {r.status_code for r in refused} == {503}
    assert {r.json()["error"]["code"] for r in refused} == {"no_worker_in_region"}
    us_client, waiting = resident_batch(us, "away")  # accepted; no worker may run it
    load = RoamingLoad(us)
    load.run()
    assert len(load.finals) == 100 and set(load.finals) == {(200, 8)}, load.finals[:5]
    assert load.retry_afters, "the ramp never limited the surge"
    assert fleet_doc(us)["failover"]["lost_regions"] == ["eu"]
    time.sleep(1.0)
    away = us_client.batches.retrieve(waiting.id)
    assert away.status == "in_progress" and away.request_counts.completed == 0
