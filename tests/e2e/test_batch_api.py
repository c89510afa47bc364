"""The Batch API on real `conveyor serve` processes, driven with the official `openai` client:
embeddings (MiniLM and synthetic), the Files endpoints, validation failures, per-line errors,
cancel, expiry with a short window, the result cache, tenant isolation and the CLI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from tests.e2e.conftest import Server, start_server, stop_server
from tests.polling import until

pytestmark = pytest.mark.slow

TERMINAL = ("completed", "failed", "expired", "cancelled")
WAIT_S = 90.0
KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-0123456789"
SLOW_SYN = {
    "name": "syn",
    "kind": "synthetic",
    "max_batch_size": 8,
    "max_wait_ms": 2,
    "batch_latency_ms": 20,
    "dim": 8,
    "max_input_tokens": 32,
    "fail_marker": "POISON",
}
FAST_JOBS = {
    "lines_per_shard": 50,
    "poll_every_s": 0.1,
    "renew_every_s": 0.2,
    "lease_s": 3,
    "min_completion_window_s": 1,
    "min_expires_after_s": 1,
    "result_cache": True,
}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """A JSONL file body."""
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def embedding_lines(num: int, model: str = "syn", prefix: str = "req") -> list[dict[str, Any]]:
    """`num` embeddings requests with custom ids `<prefix>-<i>`."""
    return [
        {"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": model, "input": f"sentence number {i}"}}
        for i in range(num)
    ]  # fmt: skip


def submit(
    client: openai.OpenAI, data: bytes, *, endpoint: str = "/v1/embeddings", window: str = "24h"
) -> Any:
    """Upload `data` and create a batch over it."""
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window=window,  # type: ignore[arg-type]
        metadata={"suite": "e2e"},
    )


def wait_until(
    client: openai.OpenAI,
    batch_id: str,
    statuses: tuple[str, ...] = TERMINAL,
    *,
    timeout_s: float = WAIT_S,
) -> Any:
    """Poll the batch until its status is one of `statuses`; a timeout names the status and
    counts it had last."""
    seen: list[Any] = []

    def reached() -> Any:
        seen[:] = [client.batches.retrieve(batch_id)]
        return seen[0] if seen[0].status in statuses else None

    def what() -> str:
        last = f" (it was {seen[0].status}, {seen[0].request_counts})" if seen else ""
        return f"batch {batch_id} to be {statuses}{last}"

    return until(reached, what, timeout_s=timeout_s)


def wait_for_progress(client: openai.OpenAI, batch_id: str, num_done: int) -> Any:
    """Poll until at least `num_done` requests finished (or the batch ended)."""

    def progressed() -> Any:
        batch = client.batches.retrieve(batch_id)
        counts = batch.request_counts
        is_done = batch.status in TERMINAL or (counts and counts.completed >= num_done)
        return batch if is_done else None

    return until(progressed, f"batch {batch_id} to progress", timeout_s=WAIT_S, interval_s=0.02)


def records(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The JSONL records of a result file (none when it has no file)."""
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def results(client: openai.OpenAI, batch: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Output and error records of a finished batch."""
    return records(client, batch.output_file_id), records(client, batch.error_file_id)


def assert_each_once(
    outputs: list[dict[str, Any]], errors: list[dict[str, Any]], ids: list[str]
) -> None:
    """Every custom_id appears exactly once across the output and error files."""
    found = [r["custom_id"] for r in outputs + errors]
    assert sorted(found) == sorted(ids)


def completed_each_once(
    client: openai.OpenAI, batch_id: str, ids: list[str], *, timeout_s: float = WAIT_S
) -> list[dict[str, Any]]:
    """Wait (up to `timeout_s`) for the batch to end; it completed, every line once and none
    failed. The output records."""
    batch = wait_until(client, batch_id, timeout_s=timeout_s)
    assert batch.status == "completed"
    assert batch.request_counts.completed == batch.request_counts.total == len(ids)
    outputs, errors = results(client, batch)
    assert errors == []
    assert_each_once(outputs, errors, ids)
    return outputs


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A slow synthetic model, two tenants, and jobs settings fit for quick tests."""
    config = {
        "models": [SLOW_SYN],
        "api_keys": [{"key": KEY_A, "tenant": "a"}, {"key": KEY_B, "tenant": "b"}],
        "jobs": FAST_JOBS,
    }
    server = start_server(tmp_path_factory.mktemp("jobs-server"), config)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def client(jobs_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=jobs_server.api, api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def other_tenant(jobs_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=jobs_server.api, api_key=KEY_B, max_retries=0)


def test_minilm_batch_matches_the_online_endpoint(main_server: Server) -> None:
    client = openai.OpenAI(base_url=main_server.api, api_key="unused", max_retries=0)
    lines = embedding_lines(20, model="all-MiniLM-L6-v2")
    lines.append({"custom_id": "too-long", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "all-MiniLM-L6-v2", "input": "word " * 2000}})  # fmt: skip
    batch = wait_until(client, submit(client, jsonl(lines)).id)
    assert batch.status == "completed" and batch.model == "all-MiniLM-L6-v2"
    assert batch.request_counts.total == 21 and batch.request_counts.completed == 20
    assert batch.request_counts.failed == 1 and batch.metadata == {"suite": "e2e"}
    outputs, errors = results(client, batch)
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    (too_long,) = errors
    assert too_long["custom_id"] == "too-long" and too_long["error"] is None
    assert too_long["response"]["status_code"] == 400
    online = client.embeddings.create(model="all-MiniLM-L6-v2", input="sentence number 7")
    by_id = {r["custom_id"]: r for r in outputs}
    vector = np.array(by_id["req-7"]["response"]["body"]["data"][0]["embedding"])
    expected = np.array(online.data[0].embedding)
    cosine = float(vector @ expected / np.linalg.norm(vector) / np.linalg.norm(expected))
    assert cosine > 0.999
    assert by_id["req-7"]["id"].startswith("batch_req_")
    assert by_id["req-7"]["response"]["request_id"].startswith("req_")


def test_files_can_be_listed_read_and_deleted(client: openai.OpenAI) -> None:
    data = jsonl(embedding_lines(3))
    uploaded = client.files.create(file=("mine.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.bytes == len(data) and uploaded.filename == "mine.jsonl"
    assert client.files.retrieve(uploaded.id).purpose == "batch"
    assert client.files.content(uploaded.id).content == data
    assert uploaded.id in [f.id for f in client.files.list(purpose="batch")]
    later = client.files.create(file=("later.jsonl", io.BytesIO(data)), purpose="batch")
    newest_first = [f.id for f in client.files.list(purpose="batch")]
    oldest_first = [f.id for f in client.files.list(purpose="batch", order="asc")]
    assert oldest_first == newest_first[::-1]
    assert oldest_first.index(uploaded.id) < oldest_first.index(later.id)
    assert client.files.delete(uploaded.id).deleted and client.files.delete(later.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", io.BytesIO(data)), purpose="fine-tune")


def wait_until_gone(client: openai.OpenAI, file_id: str) -> None:
    """Poll until the file is deleted (404)."""

    def gone() -> bool:
        try:
            client.files.retrieve(file_id)
        except openai.NotFoundError:
            return True
        return False

    until(gone, f"file {file_id} to be deleted", timeout_s=WAIT_S, interval_s=0.1)


def test_files_and_batch_outputs_expire_as_asked(client: openai.OpenAI) -> None:
    data = jsonl(embedding_lines(2, prefix="ttl"))
    uploaded = client.files.create(
        file=("ttl.jsonl", io.BytesIO(data)),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 2},
    )
    assert uploaded.expires_at == uploaded.created_at + 2
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3},
    )
    done = wait_until(client, batch.id)
    assert done.status == "completed" and done.output_file_id is not None
    output = client.files.retrieve(done.output_file_id)
    assert output.expires_at == output.created_at + 3
    wait_until_gone(client, uploaded.id)
    wait_until_gone(client, done.output_file_id)
    with pytest.raises(openai.BadRequestError, match="expires_after"):
        client.files.create(
            file=("x.jsonl", io.BytesIO(data)),
            purpose="batch",
            expires_after={"anchor": "last_used", "seconds": 5},  # type: ignore[typeddict-item]
        )


def test_a_bad_file_fails_the_batch_with_every_bad_line(client: openai.OpenAI) -> None:
    lines = embedding_lines(4)
    lines[1]["url"] = "/v1/chat/completions"
    lines[3]["custom_id"] = "req-0"
    data = jsonl(lines) + b"{broken\n" + jsonl([{**lines[0], "custom_id": "x", "method": "GET"}])
    batch = wait_until(client, submit(client, data).id)
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.output_file_id is None and batch.error_file_id is None
    found = [(e.line, e.code) for e in batch.errors.data]
    assert found == [(2, "mismatched_endpoint"), (4, "duplicate_custom_id"),
                     (5, "invalid_json_line"), (6, "invalid_method")]  # fmt: skip


def test_unknown_models_and_windows_are_refused(client: openai.OpenAI) -> None:
    batch = wait_until(client, submit(client, jsonl(embedding_lines(2, model="nope"))).id)
    assert batch.status == "failed" and {e.code for e in batch.errors.data} == {"model_not_found"}
    uploaded = client.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                              completion_window="3d")  # type: ignore[arg-type]  # fmt: skip


def test_per_line_errors_go_to_the_error_file(client: openai.OpenAI) -> None:
    lines = embedding_lines(10)
    lines[2]["body"]["input"] = "POISON pill"
    lines[5]["body"]["input"] = "w " * 100  # beyond the model's 32 tokens
    lines[7]["body"]["dimensions"] = 9999
    batch = wait_until(client, submit(client, jsonl(lines)).id)
    assert batch.status == "completed" and batch.request_counts.failed == 3
    outputs, errors = results(client, batch)
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    assert sorted((r["custom_id"], r["response"]["status_code"]) for r in errors) == [
        ("req-2", 400), ("req-5", 400), ("req-7", 400)]  # fmt: skip


def test_progress_counts_move_and_cancel_keeps_finished_lines(client: openai.OpenAI) -> None:
    lines = embedding_lines(3000)
    created = submit(client, jsonl(lines))
    running = wait_for_progress(client, created.id, 100)
    assert running.status == "in_progress" and 0 < running.request_counts.completed < 3000
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = wait_until(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    outputs, errors = results(client, batch)
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    assert len(outputs) == batch.request_counts.completed >= 100
    counts = batch.request_counts  # the lines that never ran count as failed
    assert counts.completed + counts.failed == counts.total == len(lines)
    assert {r["error"]["code"] for r in errors} == {"batch_cancelled"}
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(wait_until(client, submit(client, jsonl(lines[:3])).id).id)


def test_a_short_window_expires_keeping_finished_lines(client: openai.OpenAI) -> None:
    lines = embedding_lines(3000, prefix="exp")
    batch = wait_until(client, submit(client, jsonl(lines), window="3s").id)
    assert batch.status == "expired" and batch.expired_at is not None
    assert batch.completion_window == "3s" and batch.expires_at - batch.created_at == 3
    outputs, errors = results(client, batch)
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    assert 0 < len(outputs) == batch.request_counts.completed < 3000
    assert {r["error"]["code"] for r in errors} == {"batch_expired"}


def test_a_repeated_batch_is_answered_from_the_cache(
    client: openai.OpenAI, jobs_server: Server
) -> None:
    data = jsonl(embedding_lines(60, prefix="cache"))
    first = wait_until(client, submit(client, data).id)
    hits_before = jobs_server.metric("conveyor_batch_cache_hits_total")
    second = wait_until(client, submit(client, data).id)
    assert first.status == second.status == "completed"
    assert jobs_server.metric("conveyor_batch_cache_hits_total") - hits_before == 60
    one, two = records(client, first.output_file_id), records(client, second.output_file_id)
    by_id = {r["custom_id"]: r["response"]["body"] for r in one}
    assert all(by_id[r["custom_id"]] == r["response"]["body"] for r in two)


def test_the_cache_is_never_shared_between_tenants(
    client: openai.OpenAI, other_tenant: openai.OpenAI, jobs_server: Server
) -> None:
    data = jsonl(embedding_lines(20, prefix="tenant-cache"))
    first = wait_until(client, submit(client, data).id)
    hits_before = jobs_server.metric("conveyor_batch_cache_hits_total")
    theirs = wait_until(other_tenant, submit(other_tenant, data).id)
    assert first.status == theirs.status == "completed"
    assert jobs_server.metric("conveyor_batch_cache_hits_total") == hits_before
    again = wait_until(other_tenant, submit(other_tenant, data).id)
    assert again.status == "completed"
    assert jobs_server.metric("conveyor_batch_cache_hits_total") - hits_before == 20


def test_tenants_cannot_see_each_others_files_or_batches(
    client: openai.OpenAI, other_tenant: openai.OpenAI
) -> None:
    batch = wait_until(client, submit(client, jsonl(embedding_lines(2))).id)
    with pytest.raises(openai.NotFoundError):
        other_tenant.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other_tenant.batches.cancel(batch.id)
    for file_id in (batch.input_file_id, batch.output_file_id):
        with pytest.raises(openai.NotFoundError):
            other_tenant.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            other_tenant.files.content(file_id)
    assert batch.id not in [b.id for b in other_tenant.batches.list()]
    assert batch.input_file_id not in [f.id for f in other_tenant.files.list()]
    assert batch.id in [b.id for b in client.batches.list(limit=100)]


def test_the_cli_submits_watches_and_downloads(jobs_server: Server, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(embedding_lines(30, prefix="cli")))
    env = {**os.environ, "CONVEYOR_API_KEY": KEY_A}
    base = [sys.executable, "-m", "conveyor", "batch"]
    url = f"--url={jobs_server.url}"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args, url], env=env, capture_output=True, text=True,
                              timeout=WAIT_S, check=False)  # fmt: skip

    submitted = cli("submit", str(source), "--watch", "--metadata", "via=cli")
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip().splitlines()[-1]
    assert "completed=30" in cli("status", batch_id).stdout
    assert batch_id in cli("list").stdout
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    assert cli("results", batch_id, "-o", str(out), "--errors", str(err)).returncode == 0
    assert len(out.read_text().splitlines()) == 30 and not err.exists()  # no empty error file
    assert cli("cancel", "batch_missing").returncode == 1
