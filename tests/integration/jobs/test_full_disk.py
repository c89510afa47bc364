"""A full disk, through the HTTP app: an upload gets a retryable 503 naming the object store
and leaves nothing behind (no partial object, no file record); a running batch stalls, and
the dashboard and the metrics say why until the disk has room again."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.api.app import create_app
from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import jobs_for_service
from conveyor.host.service import Service
from conveyor.stores import local_store
from tests.disk_full import FullDisk
from tests.polling import until_async

pytestmark = pytest.mark.anyio

SYNTHETIC = {"name": "syn", "kind": "synthetic", "dim": 4}
LINE = b'{"custom_id": "r", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
DEADLINE_S = 30.0
STALLED = 'conveyor_batches_stalled{reason="disk_full",store="object_store"}'


@asynccontextmanager
async def served(tmp_path: Path, **jobs: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The serve app with its jobs subsystem running, and a client for it."""
    config = ServerConfig.model_validate(
        {"models": [SYNTHETIC], "data_dir": str(tmp_path), "jobs": jobs}
    )
    service = Service(config)
    jobs_subsystem = jobs_for_service(service)
    app = create_app(config, service=service, jobs=jobs_subsystem)
    await jobs_subsystem.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://conveyor") as http:
            yield http
    finally:
        await jobs_subsystem.stop()


async def until(http: httpx.AsyncClient, path: str, check: Callable[[Any], Any]) -> Any:
    """GET `path` until `check` holds for its JSON; fail after DEADLINE_S."""

    async def probe() -> Any:
        return check((await http.get(path)).json())

    return await until_async(probe, f"{path} to show it", timeout_s=DEADLINE_S, interval_s=0.02)


def stalled_gauge(metrics: str) -> float:
    (line,) = [line for line in metrics.splitlines() if line.startswith(STALLED)]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("errno_code", [errno.ENOSPC, errno.EDQUOT])
async def test_an_upload_to_a_full_disk_is_a_503_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_code: int
) -> None:
    async with served(tmp_path) as http:
        monkeypatch.setattr(local_store, "os", FullDisk(64 * 1024, errno_code))
        upload = {"file": ("in.jsonl", LINE * 10_000)}  # ~750 KB onto 64 KiB of room
        response = await http.post("/v1/files", files=upload, data={"purpose": "batch"})
        monkeypatch.undo()
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) > 0
        error = response.json()["error"]
        assert error["code"] == "object_store_unavailable" and error["type"] == "server_error"
        assert os.strerror(errno_code) in error["message"]
        listed = await http.get("/v1/files")
        assert listed.status_code == 200 and listed.json()["data"] == []
    leftovers = [p for p in (tmp_path / "objects").rglob("*") if p.is_file()]
    assert leftovers == []


async def test_a_batch_on_a_full_disk_shows_its_stall_until_the_disk_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "syn", "input": f"text {i}"}}
        for i in range(6)
    ]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    async with served(tmp_path, poll_every_s=0.02, renew_every_s=0.05) as http:
        upload = await http.post("/v1/files", files={"file": ("in.jsonl", data)},
                                 data={"purpose": "batch"})  # fmt: skip
        assert upload.status_code == 200, upload.text
        # From here no object can be written: shard outputs fail with ENOSPC.
        monkeypatch.setattr(local_store, "os", FullDisk(0))
        created = await http.post("/v1/batches", json={"input_file_id": upload.json()["id"],
                                  "endpoint": "/v1/embeddings", "completion_window": "24h"})  # fmt: skip
        batch_id = created.json()["id"]
        since = int(time.time())

        def stall(state: dict[str, Any]) -> dict[str, Any] | None:
            return next((j["stall"] for j in state["jobs"] or () if j["id"] == batch_id), None)

        shown = await until(http, "/v1/dashboard/state", stall)
        assert shown["code"] == "object_store_unavailable"
        assert "the object store is full" in shown["message"]
        assert os.strerror(errno.ENOSPC) in shown["message"]
        assert since - 1 <= shown["since"] <= time.time()
        assert stalled_gauge((await http.get("/metrics")).text) == 1
        batch = (await http.get(f"/v1/batches/{batch_id}")).json()
        assert batch["status"] == "in_progress"
        assert batch["errors"]["data"][0]["code"] == "object_store_unavailable"

        monkeypatch.undo()
        done = await until(http, f"/v1/batches/{batch_id}", lambda b: b["status"] == "completed")
        assert done and (await http.get(f"/v1/batches/{batch_id}")).json()["errors"] is None
        state = (await http.get("/v1/dashboard/state")).json()
        assert [j["stall"] for j in state["jobs"] if j["id"] == batch_id] == [None]
        assert stalled_gauge((await http.get("/metrics")).text) == 0
