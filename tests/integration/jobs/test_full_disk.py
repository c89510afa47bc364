"""An upload onto a full disk, through the HTTP app: a retryable 503 naming the object store,
and nothing left behind (no partial object, no file record)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import httpx
import pytest

from conveyor.api.app import create_app
from conveyor.config import ServerConfig
from conveyor.endpoints.dispatch import jobs_for_service
from conveyor.service import Service
from conveyor.stores import local_store
from tests.disk_full import FullDisk

pytestmark = pytest.mark.anyio

SYNTHETIC = {"name": "syn", "kind": "synthetic", "dim": 4}
LINE = b'{"custom_id": "r", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'


@pytest.mark.parametrize("errno_code", [errno.ENOSPC, errno.EDQUOT])
async def test_an_upload_to_a_full_disk_is_a_503_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_code: int
) -> None:
    config = ServerConfig.model_validate({"models": [SYNTHETIC], "data_dir": str(tmp_path)})
    service = Service(config)
    jobs = jobs_for_service(service)
    app = create_app(config, service=service, jobs=jobs)
    await jobs.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://conveyor") as http:
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
    finally:
        await jobs.stop()
    leftovers = [p for p in (tmp_path / "objects").rglob("*") if p.is_file()]
    assert leftovers == []
