"""Model distribution between real worker processes on loopback (SQLite store, local origin).

A pushed tiny Llama is pulled by a first worker from the origin; a second worker pulls it from
the first, which serves a chunk corrupted on its disk: the second rejects it by its digest,
skips that peer and takes what is left from the origin. The model then serves. The fleet
has an internal key: the chunk servers want it and the pullers present it.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from conveyor.distribution.manifest import Manifest
from conveyor.distribution.push import push_model
from conveyor.fakes.checkpoints import build_tiny_llama
from conveyor.stores import open_job_store, open_object_store
from tests.integration.fleet.conftest import Fleet, Proc

CHUNK_BYTES = 64 * 1024
# The chunk servers want it; the pullers present it to each other.
FLEET_KEY = "fleet-key-0123456789abcdef"
# What a gateway would send a worker that has the fleet key.
AS_GATEWAY = {"Authorization": f"Bearer {FLEET_KEY}", "X-Conveyor-Tenant": "t"}


def worker_config(tmp: Path, name: str) -> dict[str, object]:
    """A worker hosting the pushed model `tiny` from its own data directory."""
    model = {
        "name": "tiny", "kind": "generate", "path": "conveyor://tiny",
        "kv_cache_tokens": 256, "max_model_len": 256,
    }  # fmt: skip
    return {"data_dir": str(tmp / name), "models": [model], "fleet": {"internal_key": FLEET_KEY}}


def start(fleet: Fleet, name: str, objects: Path) -> Proc:
    """Start a worker pulling `tiny`; returns once it is ready."""
    config = worker_config(fleet.tmp, name)
    return fleet.start_worker(name, config=config, extra_args=("--objects", str(objects)))


def test_second_worker_pulls_from_the_first_and_rejects_its_corrupt_chunk(tmp_path: Path) -> None:
    store_url, objects = f"sqlite://{tmp_path}/jobs.db", tmp_path / "objects"
    store = open_job_store(store_url)
    try:
        result = push_model(
            build_tiny_llama(tmp_path / "model"), "tiny", store, open_object_store(str(objects)),
            chunk_bytes=CHUNK_BYTES, now=1.0,
        )  # fmt: skip
    finally:
        store.close()
    manifest: Manifest = result.manifest
    fleet = Fleet(store_url, tmp_path)
    try:
        first = start(fleet, "first", objects)
        assert first.metric("conveyor_model_fetch_bytes_total", source="origin") == (
            manifest.total_bytes
        )
        victim = manifest.unique_chunks()[0]
        (tmp_path / "first" / "model-cache" / "chunks" / victim.digest).write_bytes(
            b"\x00" * victim.size_bytes
        )
        second = start(fleet, "second", objects)
        assert second.metric("conveyor_model_corrupt_chunks_total", source="peer") == 1
        # The lying peer is skipped for the rest of the pull: the rest comes from the origin.
        from_origin = second.metric("conveyor_model_fetch_bytes_total", source="origin")
        from_peer = second.metric("conveyor_model_fetch_bytes_total", source="peer")
        assert from_origin >= victim.size_bytes
        assert from_origin + from_peer == manifest.total_bytes
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        answer = httpx.post(
            f"{second.url}/v1/completions", json=body, headers=AS_GATEWAY, timeout=30
        )
        assert answer.status_code == 200, answer.text
    finally:
        fleet.stop_all()
