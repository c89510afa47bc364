"""Durability of Message Batches: a server killed with SIGKILL mid-batch and started again on
the same data finishes the batch with every request answered exactly once, on SQLite and
on PostgreSQL, as OpenAI batches do (``test_batch_restart``).

Anthropic's ``request_counts`` show every request ``processing`` until the end, so the
progress to kill at is read from the same batch through the OpenAI Batch API."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import start_server, stop_server
from tests.e2e.test_anthropic_batches import raw_results, tiny_llama, wait_ended
from tests.e2e.test_batch_api import wait_for_progress

pytestmark = pytest.mark.slow

NUM_REQUESTS = 400  # ~75 a second on the tiny model: killed well before the end
JOBS = {"lines_per_shard": 50, "poll_every_s": 0.1, "renew_every_s": 0.2, "lease_s": 2}


def kill_and_restart(tmp_path: Path, jobs: dict[str, Any]) -> None:
    """Run a message batch, SIGKILL the server mid-way, restart it on the same data, check."""
    config = {"models": [tiny_llama(build_tiny_llama(tmp_path / "llama"))], "jobs": jobs}
    first = start_server(tmp_path, config)
    client = anthropic.Anthropic(base_url=first.url, api_key="unused", max_retries=0)
    requests = [{"custom_id": f"k{i}", "params": {
        "model": "tiny-llama", "max_tokens": 32, "messages": [{"role": "user",
                                                               "content": f"Tale {i}"}]}}
                for i in range(NUM_REQUESTS)]  # fmt: skip
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    same_batch = "batch_" + created.id.removeprefix("msgbatch_")
    openai_client = openai.OpenAI(base_url=first.api, api_key="unused", max_retries=0)
    running = wait_for_progress(openai_client, same_batch, 40)
    assert running.status == "in_progress" and running.request_counts.completed < NUM_REQUESTS
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    second = start_server(tmp_path, config)
    try:
        client = anthropic.Anthropic(base_url=second.url, api_key="unused", max_retries=0)
        started = time.monotonic()
        batch = wait_ended(client, created.id)
        assert time.monotonic() - started < 90
        assert batch.request_counts.succeeded == NUM_REQUESTS
        results = raw_results(second, batch)
        assert sorted(r.custom_id for r in results) == sorted(r["custom_id"] for r in requests)
        assert all(r.result.type == "succeeded" for r in results)
    finally:
        stop_server(second)


def test_sigkill_mid_message_batch_then_restart_on_sqlite(tmp_path: Path) -> None:
    kill_and_restart(tmp_path, JOBS)


@pytest.mark.postgres
def test_sigkill_mid_message_batch_then_restart_on_postgres(
    tmp_path: Path, postgres_url: str
) -> None:
    kill_and_restart(tmp_path, {**JOBS, "job_store_url": postgres_url})
