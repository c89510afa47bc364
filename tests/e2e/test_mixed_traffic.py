"""A batch job and online traffic share one model: no online caller is refused, no line lost.

The job fills its own queue class to the bound while the online callers keep coming; each
priority class has its own bound, so the online callers never see a 429, and every
custom_id of the job appears exactly once in its output.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_batch_api import (
    assert_each_once,
    embedding_lines,
    jsonl,
    results,
    submit,
    wait_for_progress,
    wait_until,
)

pytestmark = pytest.mark.slow

NUM_LINES = 8000
NUM_ONLINE = 300
MODEL = {"name": "syn", "kind": "synthetic", "max_batch_size": 50, "max_wait_ms": 2,
         "batch_latency_ms": 20, "per_item_ms": 0.2, "dim": 8, "max_queue": 200,
         "max_input_tokens": 32}  # fmt: skip
JOBS = {"lines_per_shard": 500, "poll_every_s": 0.1, "renew_every_s": 0.2, "lease_s": 5,
        "max_lines_in_flight": 512}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("mixed"), {"models": [MODEL], "jobs": JOBS})
    yield running
    stop_server(running)


def test_online_callers_are_served_beside_a_job_that_fills_its_queue(server: Server) -> None:
    client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
    lines = embedding_lines(NUM_LINES, prefix="mixed")
    batch = submit(client, jsonl(lines))
    before = wait_for_progress(client, batch.id, 100)
    assert before.status == "in_progress"

    def online(i: int) -> int:
        body = {"model": "syn", "input": f"online caller {i}"}
        return httpx.post(f"{server.api}/embeddings", json=body, timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(online, range(NUM_ONLINE)))
    during = client.batches.retrieve(batch.id)
    assert statuses == [200] * NUM_ONLINE
    # The job kept running beside the online callers (it may have finished meanwhile).
    assert during.request_counts.completed > before.request_counts.completed
    done = wait_until(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts.completed == NUM_LINES
    outputs, errors = results(client, done)
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
