"""Durability of background responses: `serve` killed with SIGKILL while some run and some
wait, then started again on the same data, answers every one exactly once (each ends with
its output, and the usage ledger counts each once), on SQLite and on PostgreSQL."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import start_server, stop_server
from tests.polling import until

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
NUM_RESPONSES = 6
ENDED = ("completed", "incomplete", "failed", "cancelled")
WAIT_S = 120.0
# Two run at once (the rest wait queued); a killed run's lease lapses within 2 s.
JOBS = {"lease_s": 2, "renew_every_s": 0.2, "poll_every_s": 0.1, "max_lines_in_flight": 2}


def config(checkpoint: Path, jobs: dict[str, Any]) -> dict[str, Any]:
    generate = {
        "name": MODEL, "kind": "generate", "path": str(checkpoint), "device": "cpu",
        "kv_cache_tokens": 8192, "max_num_seqs": 2, "max_num_batched_tokens": 256, "threads": 1,
    }  # fmt: skip
    return {"models": [generate], "jobs": {**JOBS, **jobs}}


def statuses(client: openai.OpenAI, ids: list[str]) -> list[str]:
    return [client.responses.retrieve(response_id).status or "" for response_id in ids]


def wait_for(client: openai.OpenAI, ids: list[str], is_ready: Any) -> list[str]:
    """Poll the responses' statuses until ``is_ready(statuses)``."""
    return until(
        lambda: found if is_ready(found := statuses(client, ids)) else None,
        f"the responses {ids} to be ready", timeout_s=WAIT_S,
    )  # fmt: skip


def kill_and_restart(tmp_path: Path, jobs: dict[str, Any]) -> None:
    checkpoint = build_tiny_llama(tmp_path / "llama")
    first = start_server(tmp_path, config(checkpoint, jobs))
    client = openai.OpenAI(base_url=first.api, api_key="unused", max_retries=0)
    ids = [
        client.responses.create(model=MODEL, input=f"Story number {i}.", background=True,
                                max_output_tokens=600, temperature=0).id
        for i in range(NUM_RESPONSES)
    ]  # fmt: skip
    before = wait_for(client, ids, lambda found: "in_progress" in found)
    assert "queued" in before  # killed with some running and some waiting
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    second = start_server(tmp_path, config(checkpoint, jobs))
    try:
        client = openai.OpenAI(base_url=second.api, api_key="unused", max_retries=0)
        after = wait_for(client, ids, lambda found: all(s in ENDED for s in found))
        assert set(after) <= {"completed", "incomplete"}
        answers = [client.responses.retrieve(response_id) for response_id in ids]
        assert all(answer.output and answer.usage for answer in answers)
        ledger = usage_totals(second.api)
        assert ledger["num_model_requests"] == NUM_RESPONSES  # each answered once
        assert ledger["output_tokens"] == sum(a.usage.output_tokens for a in answers if a.usage)
    finally:
        stop_server(second)


def usage_totals(api: str) -> dict[str, int]:
    """The usage ledger's totals of the last two days (requests and tokens)."""
    since = int(time.time()) - 86_400
    page = httpx.get(f"{api}/usage", params={"start_time": since, "bucket_width": "1d"}).json()
    totals = {"num_model_requests": 0, "output_tokens": 0}
    for bucket in page["data"]:
        for result in bucket["results"]:
            for name in totals:
                totals[name] += result[name]
    return totals


def test_sigkill_mid_run_then_restart_on_sqlite(tmp_path: Path) -> None:
    kill_and_restart(tmp_path, {})


@pytest.mark.postgres
def test_sigkill_mid_run_then_restart_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    kill_and_restart(tmp_path, {"job_store_url": postgres_url})
