"""A real `conveyor serve` whose PostgreSQL job store goes away mid-batch, through a TCP proxy
the test controls: frozen, then refused. The batch and file endpoints answer 503 with
Retry-After and `job_store_unavailable` within seconds, online embeddings keep answering, and
once the proxy passes again the running batch completes by itself, each custom_id once."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import openai
import pytest

from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_batch_api import (
    TERMINAL,
    WAIT_S,
    assert_each_once,
    embedding_lines,
    jsonl,
    results,
    submit,
    wait_for_progress,
)
from tests.e2e.test_batch_restart import RESTART_SYN
from tests.polling import until
from tests.tcp_proxy import ProxyMode, TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NUM_LINES = 3000
# Defaults: 3 s to connect, 3 s statement timeout + 1 s before a silent server is dropped,
# 5 s for a pooled connection; "a few seconds" allows the worst of a connect after a wait.
MAX_TIME_TO_503_S = 9.0
OUTAGE_JOBS = {"lines_per_shard": 100, "poll_every_s": 0.1, "renew_every_s": 0.2, "lease_s": 2}
HTTP_TIMEOUT_S = 60.0


def through_proxy(url: str, port: int) -> str:
    """The same database URL, reached through the proxy's port."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}"))


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[TcpProxy]:
    """A proxy in front of the test database's server."""
    parts = urlsplit(postgres_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as running:
        yield running


def store_calls(server: Server, file_id: str, batch_id: str) -> dict[str, Callable[[], Any]]:
    """One request per file and batch operation that needs the job store."""
    http = httpx.Client(base_url=server.api, timeout=HTTP_TIMEOUT_S)
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    upload = {"file": ("x.jsonl", io.BytesIO(jsonl(embedding_lines(2))))}
    return {
        "GET /files": lambda: http.get("/files"),
        "GET /files/{id}": lambda: http.get(f"/files/{file_id}"),
        "POST /files": lambda: http.post("/files", files=upload, data={"purpose": "batch"}),
        "GET /batches": lambda: http.get("/batches"),
        "GET /batches/{id}": lambda: http.get(f"/batches/{batch_id}"),
        "POST /batches": lambda: http.post("/batches", json=body),
        "POST /batches/{id}/cancel": lambda: http.post(f"/batches/{batch_id}/cancel"),
    }


def time_to_503(calls: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Make each call; each must answer a retryable 503 naming the job store. Seconds each."""
    elapsed: dict[str, float] = {}
    for name, call in calls.items():
        started = time.monotonic()
        response = call()
        elapsed[name] = round(time.monotonic() - started, 2)
        assert response.status_code == 503, (name, response.status_code, response.text)
        assert int(response.headers["retry-after"]) > 0, name
        error = response.json()["error"]
        assert error["code"] == "job_store_unavailable", (name, error)
        assert error["type"] == "server_error", (name, error)
    return elapsed


def assert_online_embeddings_work(server: Server) -> None:
    """The online path does not touch the job store."""
    response = httpx.post(
        f"{server.api}/embeddings", json={"model": "syn", "input": ["still here"]}, timeout=10
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 1


def completed_until_done(client: openai.OpenAI, batch_id: str) -> tuple[Any, list[int]]:
    """Poll the batch until it ends: the last Batch object and every `completed` shown."""
    shown: list[int] = []

    def ended() -> Any:
        batch = client.batches.retrieve(batch_id)
        shown.append(batch.request_counts.completed if batch.request_counts else 0)
        return batch if batch.status in TERMINAL else None

    return until(ended, f"batch {batch_id} to end", timeout_s=WAIT_S, interval_s=0.02), shown


def test_postgres_frozen_then_refused_mid_batch(
    tmp_path: Path, postgres_url: str, proxy: TcpProxy
) -> None:
    jobs = {**OUTAGE_JOBS, "job_store_url": through_proxy(postgres_url, proxy.port)}
    server = start_server(tmp_path, {"models": [RESTART_SYN], "jobs": jobs})
    try:
        client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        lines = embedding_lines(NUM_LINES)
        created = submit(client, jsonl(lines))
        started = wait_for_progress(client, created.id, 200)
        assert started.status == "in_progress"
        calls = store_calls(server, created.input_file_id, created.id)
        measured: dict[str, dict[str, float]] = {}
        for mode in (ProxyMode.FREEZE, ProxyMode.REFUSE):
            proxy.set_mode(mode)
            measured[mode.value] = time_to_503(calls)
            assert_online_embeddings_work(server)
        print(f"\nseconds to 503: {measured}")
        for mode, elapsed in measured.items():
            assert max(elapsed.values()) <= MAX_TIME_TO_503_S, (mode, elapsed)
        assert server.metric("conveyor_store_errors_total", store="job_store") > 0
        assert "failed in the job_store, will retry" in server.log()

        proxy.set_mode(ProxyMode.PASS)
        batch, shown = completed_until_done(client, created.id)
        assert server.process.poll() is None  # the same process: no restart
        # Shards whose leases lapsed in the outage reran; the counts never went back.
        assert shown == sorted(shown) and shown[0] >= started.request_counts.completed
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == batch.request_counts.total == NUM_LINES
        assert batch.errors is None
        outputs, errors = results(client, batch)
        assert errors == []
        assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    finally:
        stop_server(server)
