"""The chunk server app: verified chunks by digest, capped or not, in process."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.chunk_server import chunk_app
from conveyor.metrics import DistributionMetrics

DATA = bytes(range(256)) * 200  # 51,200 bytes: several pacer pieces


@pytest.mark.parametrize("upload_bytes_s", [None, 1e9])
def test_a_held_chunk_is_served_whole_with_its_length(
    tmp_path: Path, upload_bytes_s: float | None
) -> None:
    cache = ChunkCache(tmp_path)
    digest = hashlib.sha256(DATA).hexdigest()
    cache.write_chunk(digest, len(DATA), [DATA])
    metrics = DistributionMetrics(CollectorRegistry())
    with TestClient(chunk_app(cache, metrics, upload_bytes_s)) as client:
        answer = client.get(f"/v1/internal/chunks/{digest}")
        missing = client.get(f"/v1/internal/chunks/{'0' * 64}")
    assert answer.status_code == 200
    assert answer.content == DATA
    assert answer.headers["content-length"] == str(len(DATA))
    assert missing.status_code == 404
    assert metrics.chunks_served._value.get() == 1
