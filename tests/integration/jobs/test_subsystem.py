"""The jobs subsystem on real stores: SQLite and PostgreSQL job stores, local and S3 object
stores, and two subsystems (two processes' worth) sharing one store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from conveyor.jobs.config import JobsConfig
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.stores.records import BatchRecord, BatchStatus
from conveyor.stores.tenant_records import UsageRow
from conveyor.tenants.usage import Payer
from tests.polling import until_async
from tests.unit.jobs.fakes import input_file

pytestmark = pytest.mark.anyio
WAIT_S = 60.0
BOUNDARY = "xyz"


async def embed(endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
    """A stand-in endpoint: one 'vector' per input, after yielding to the loop."""
    await asyncio.sleep(0)
    return {"object": "list", "data": [{"embedding": [len(body["input"])]}], "model": body["model"]}


def subsystem(job_store: str, objects: str, tmp_path: Path, worker: str) -> JobsSubsystem:
    config = JobsConfig(job_store_url=job_store, object_store_url=objects, worker_id=worker,
                        lines_per_shard=10, poll_every_s=0.02, renew_every_s=0.05, lease_s=5)  # fmt: skip
    return JobsSubsystem(config, tmp_path, embed, lambda name: name == "m")


async def body_of(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def run_batch(
    jobs: JobsSubsystem, num_lines: int
) -> tuple[BatchRecord, list[dict[str, Any]]]:
    """Upload, create and wait for a batch; return it and its output records."""
    from conveyor.api.multipart import MultipartStream

    data = input_file(num_lines)
    form = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\""
            "\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()  # fmt: skip
    stream = MultipartStream(f"multipart/form-data; boundary={BOUNDARY}")
    record = await jobs.api.upload_file("t", stream.file_chunks(body_of(form)), stream)
    batch = await jobs.api.create_batch("t", {"input_file_id": record.id,
                                              "endpoint": "/v1/embeddings",
                                              "completion_window": "24h"})  # fmt: skip

    async def completed() -> BatchRecord | None:
        found = await jobs.api.get_batch("t", batch.id)
        return found if found.status is BatchStatus.COMPLETED else None

    batch = await until_async(completed, f"{batch.id} to complete", timeout_s=WAIT_S,
                              interval_s=0.02)  # fmt: skip
    _, chunks = await jobs.api.file_content("t", batch.output_file_id or "")
    lines = b"".join(chunks).splitlines()
    return batch, [orjson.loads(line) for line in lines]


async def test_two_subsystems_share_one_store_and_run_each_line_once(
    job_store_url: str,
    tmp_path: Path,
) -> None:
    objects = str(tmp_path / "objects")
    first = subsystem(job_store_url, objects, tmp_path, "worker-a")
    second = subsystem(job_store_url, objects, tmp_path, "worker-b")
    await first.start()
    await second.start()
    try:
        batch, outputs = await run_batch(first, 300)
    finally:
        await first.stop()
        await second.stop()
    assert batch.request_counts.completed == 300 and batch.error_file_id is None
    assert sorted(r["custom_id"] for r in outputs) == sorted(f"r{i}" for i in range(300))


async def test_an_s3_object_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with moto.mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="jobs")
        jobs = subsystem(f"sqlite://{tmp_path}/jobs.db", "s3://jobs/conveyor", tmp_path, "w")
        await jobs.start()
        try:
            batch, outputs = await run_batch(jobs, 25)
        finally:
            await jobs.stop()
    assert batch.status is BatchStatus.COMPLETED and len(outputs) == 25


async def test_release_hands_the_work_back_and_keeps_the_store_open(tmp_path: Path) -> None:
    """A draining worker releases its shards first and writes its last usage after; the
    store closed at release lost those rows ("job store is closed")."""
    jobs = subsystem(f"sqlite://{tmp_path}/jobs.db", str(tmp_path / "objects"), tmp_path, "w")
    await jobs.start()
    await jobs.release()
    row = UsageRow(tenant="t", model="m", minute_start=60, num_requests=1)
    await asyncio.to_thread(jobs.context.store.blocking.add_usage, [row])
    assert jobs.context.store.blocking.list_usage(0) == [row]
    await jobs.stop()
    with pytest.raises(RuntimeError, match="not started"):
        jobs.context  # noqa: B018
