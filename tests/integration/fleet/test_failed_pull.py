"""A worker whose pull fails (a corrupt origin) is not ready and does not register the model,
while its other model serves and is registered (a real worker process, SQLite store)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from conveyor.distribution.manifest import chunk_key
from conveyor.distribution.push import push_model
from conveyor.stores import open_job_store, open_object_store
from tests.integration.fleet.conftest import MODEL, SYNTHETIC, Fleet
from tests.polling import until


def push_corrupt(tmp_path: Path, store_url: str, objects: Path) -> None:
    """Push a model `broken` whose one chunk the origin then holds corrupted."""
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "weights.bin").write_bytes(b"w" * 256)
    store = open_job_store(store_url)
    try:
        result = push_model(
            directory, "broken", store, open_object_store(str(objects)), chunk_bytes=1024, now=1.0
        )
    finally:
        store.close()
    (chunk,) = result.manifest.unique_chunks()
    (objects / chunk_key(chunk.digest)).write_bytes(b"x" * chunk.size_bytes)


def registered_models(store_url: str, worker_id: str) -> tuple[str, ...] | None:
    """The models the registry lists for `worker_id` (None: not registered)."""
    store = open_job_store(store_url)
    try:
        rows = store.list_workers(0.0, 1e12)
    finally:
        store.close()
    return next((row.models for row in rows if row.worker_id == worker_id), None)


def test_a_failed_pull_leaves_the_worker_not_ready_and_the_model_unregistered(
    tmp_path: Path,
) -> None:
    store_url, objects = f"sqlite://{tmp_path}/jobs.db", tmp_path / "objects"
    push_corrupt(tmp_path, store_url, objects)
    fleet = Fleet(store_url, tmp_path)
    broken = {"name": "broken", "kind": "embedding", "path": "conveyor://broken"}
    config: dict[str, Any] = {"data_dir": str(tmp_path / "w1"), "models": [SYNTHETIC, broken]}
    try:
        proc = fleet.spawn_worker("w1", config=config, extra_args=("--objects", str(objects)))
        until(lambda: registered_models(store_url, "w1") is not None, "registration", timeout_s=60)
        ready = httpx.get(f"{proc.url}/ready", timeout=5)
        assert ready.status_code == 503, ready.text
        assert list(ready.json()["failed"]) == ["broken"]
        assert registered_models(store_url, "w1") == (MODEL,)
        body = {"model": MODEL, "input": "x"}
        assert httpx.post(f"{proc.url}/v1/embeddings", json=body, timeout=10).status_code == 200
    finally:
        fleet.stop_all()
