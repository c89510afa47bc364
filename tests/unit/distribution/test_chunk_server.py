"""The chunk server app: verified chunks by digest, capped or not, in process."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.chunk_server import chunk_app
from conveyor.fleet.credential import FleetCredential
from conveyor.observability.metrics import DistributionMetrics

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


def test_unknown_paths_and_methods_get_the_json_error_shape(tmp_path: Path) -> None:
    metrics = DistributionMetrics(CollectorRegistry())
    with TestClient(chunk_app(ChunkCache(tmp_path), metrics)) as client:
        unknown = client.get("/v1/internal/elsewhere")
        wrong_method = client.post(f"/v1/internal/chunks/{'0' * 64}")
        bad_digest = client.get("/v1/internal/chunks/xyz")
    for answer, status in ((unknown, 404), (wrong_method, 405), (bad_digest, 400)):
        assert answer.status_code == status
        assert answer.headers["content-type"] == "application/json"
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


FLEET_KEY = b"fleet-key-0123456789abcdef"


def test_with_a_fleet_key_the_chunk_server_wants_it_from_every_caller(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path)
    digest = hashlib.sha256(DATA).hexdigest()
    cache.write_chunk(digest, len(DATA), [DATA])
    metrics = DistributionMetrics(CollectorRegistry())
    app = chunk_app(cache, metrics, credential=FleetCredential(FLEET_KEY))
    url = f"/v1/internal/chunks/{digest}"
    with TestClient(app) as client:
        refused = [
            client.get(url),
            client.get(url, headers={"Authorization": "Bearer not-the-fleet-key-000"}),
            client.get(url, headers={"Authorization": f"Basic {FLEET_KEY.decode()}"}),
            client.get("/v1/internal/elsewhere"),
        ]
        served = client.get(url, headers={"Authorization": f"Bearer {FLEET_KEY.decode()}"})
    for answer in refused:
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_api_key"
        assert FLEET_KEY.decode() not in answer.text
    assert served.status_code == 200 and served.content == DATA
    assert metrics.chunks_served._value.get() == 1
