"""Per-region object stores on one machine: a resident tenant's batch files stay in its region.

Three object store directories: the default one (``--objects``) and one per region, ``eu``
and ``us`` (``jobs.region_object_store_urls``, as ``file://`` URLs). Tenant ``home-eu`` is
pinned to eu, ``home-us`` to us, ``roaming`` to nothing. One worker per region and a gateway
in eu. Each tenant uploads a file and runs a batch over it through the gateway; every batch
completes with each line exactly once, and each tenant's bytes (its input and its output,
found by its custom ids) are in its own store's directory and in no other.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.e2e.test_batch_api import assert_each_once, embedding_lines, jsonl, results
from tests.integration.fleet.conftest import SYNTHETIC, Fleet
from tests.integration.fleet.test_batch_fleet import JOBS, finished

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

KEYS = {"home-eu": "home-eu-key-0123456789", "home-us": "home-us-key-0123456789",
        "roaming": "roaming-key-0123456789"}  # fmt: skip
STORE_OF = {"home-eu": "eu", "home-us": "us", "roaming": "default"}
NUM_LINES = 30


def config(dirs: dict[str, Path]) -> dict[str, Any]:
    """The same config for every process: keys, pinned tenants, the regions' stores."""
    regions = {region: f"file://{dirs[region]}" for region in ("eu", "us")}
    return {
        "models": [SYNTHETIC],
        "jobs": {**JOBS, "region_object_store_urls": regions},
        "api_keys": [{"key": key, "tenant": tenant} for tenant, key in KEYS.items()],
        "tenants": [{"name": "home-eu", "regions": ["eu"]},
                    {"name": "home-us", "regions": ["us"]}],
    }  # fmt: skip


def tenants_in(directory: Path) -> set[str]:
    """The tenants whose custom ids appear in any object under ``directory``."""
    data = b"".join(p.read_bytes() for p in directory.rglob("*") if p.is_file())
    return {tenant for tenant in KEYS if f"{tenant}-line-".encode() in data}


def test_each_tenants_batch_files_stay_in_its_regions_store(fleet: Fleet, tmp_path: Path) -> None:
    dirs = {name: tmp_path / f"objects-{name}" for name in ("default", "eu", "us")}
    doc = config(dirs)
    objects = ("--objects", str(dirs["default"]))
    workers = [fleet.spawn_worker(name, config=doc, extra_args=(*objects, "--region", region))
               for name, region in (("a", "eu"), ("c", "us"))]  # fmt: skip
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    gateway = fleet.start_gateway(extra_args=("--config", str(path), *objects, "--region", "eu"))
    for worker in workers:
        fleet.wait_ready(worker)
    batches = {}
    for tenant, key in KEYS.items():
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
        lines = embedding_lines(NUM_LINES, prefix=f"{tenant}-line")
        data = io.BytesIO(jsonl(lines))
        uploaded = client.files.create(file=(f"{tenant}.jsonl", data), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        batches[tenant] = (client, batch, [line["custom_id"] for line in lines])
    for tenant, (client, batch, ids) in batches.items():
        done = finished(client, batch.id)
        assert done.status == "completed", (tenant, done)
        outputs, errors = results(client, done)
        assert errors == []
        assert_each_once(outputs, errors, ids)
    for tenant, store in STORE_OF.items():
        assert tenant in tenants_in(dirs[store])
    assert {name: tenants_in(directory) for name, directory in dirs.items()} == {
        "default": {"roaming"}, "eu": {"home-eu"}, "us": {"home-us"},
    }  # fmt: skip
