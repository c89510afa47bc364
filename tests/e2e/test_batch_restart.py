"""Durability: a server killed with SIGKILL mid-batch and started again on the same data
finishes the batch with each custom_id exactly once, on SQLite and on PostgreSQL."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import start_server, stop_server
from tests.e2e.test_batch_api import (
    SLOW_SYN,
    completed_each_once,
    embedding_lines,
    jsonl,
    submit,
    wait_for_progress,
)

pytestmark = pytest.mark.slow

NUM_LINES = 2000
RESTART_SYN = {**SLOW_SYN, "max_batch_size": 16}  # ~800 lines/s: killed well before the end
RESTART_JOBS = {"lines_per_shard": 100, "poll_every_s": 0.1, "renew_every_s": 0.2, "lease_s": 2}


def kill_and_restart(tmp_path: Path, config: dict[str, Any]) -> None:
    """Run a batch, SIGKILL the server mid-way, restart it on the same data, check it."""
    first = start_server(tmp_path, config)
    client = openai.OpenAI(base_url=first.api, api_key="unused", max_retries=0)
    lines = embedding_lines(NUM_LINES)
    created = submit(client, jsonl(lines))
    running = wait_for_progress(client, created.id, 300)
    assert running.status == "in_progress"
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    second = start_server(tmp_path, config)
    try:
        client = openai.OpenAI(base_url=second.api, api_key="unused", max_retries=0)
        completed_each_once(client, created.id, [line["custom_id"] for line in lines])
    finally:
        stop_server(second)


def test_sigkill_mid_batch_then_restart_on_sqlite(tmp_path: Path) -> None:
    kill_and_restart(tmp_path, {"models": [RESTART_SYN], "jobs": RESTART_JOBS})


@pytest.mark.postgres
def test_sigkill_mid_batch_then_restart_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    jobs = {**RESTART_JOBS, "job_store_url": postgres_url}
    kill_and_restart(tmp_path, {"models": [RESTART_SYN], "jobs": jobs})
