"""Fair shares on a real store: a small job of tenant B, submitted behind a big job of
tenant A, finishes in about B's share of the runners instead of after A's job; a tenant
over its monthly budget waits in progress."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor.jobs.config import JobsConfig
from conveyor.jobs.fair_share import FairShare
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.stores.records import BatchRecord, BatchStatus
from conveyor.stores.tenant_records import UsageRow
from conveyor.tenants.budget import MonthlyBudgets, month_start_s
from conveyor.tenants.usage import Payer
from tests.integration.jobs.test_subsystem import BOUNDARY, body_of
from tests.polling import until_async
from tests.unit.jobs.fakes import input_file

pytestmark = pytest.mark.anyio
WAIT_S = 60.0
BIG_LINES = 1000
SMALL_LINES = 50


class GatedEndpoint:
    """Answers every line once `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
        await self.release.wait()
        return {"object": "list", "data": [{"embedding": [1.0]}], "model": body["model"]}


async def submit(jobs: JobsSubsystem, tenant: str, num_lines: int) -> BatchRecord:
    """Upload `num_lines` lines as `tenant` and create a batch over them."""
    from conveyor.api.multipart import MultipartStream

    form = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\""
            "\r\n\r\n").encode() + input_file(num_lines) + f"\r\n--{BOUNDARY}--\r\n".encode()  # fmt: skip
    stream = MultipartStream(f"multipart/form-data; boundary={BOUNDARY}")
    record = await jobs.api.upload_file(tenant, stream.file_chunks(body_of(form)), stream)
    body = {"input_file_id": record.id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    return await jobs.api.create_batch(tenant, body)


async def wait_status(jobs: JobsSubsystem, batch: BatchRecord, status: BatchStatus) -> BatchRecord:
    """Poll until the batch reaches `status` (bounded by WAIT_S)."""

    async def reached() -> BatchRecord | None:
        found = await jobs.api.get_batch(batch.tenant, batch.id)
        return found if found.status is status else None

    if batch.status is status:
        return batch
    return await until_async(reached, f"{batch.id} to be {status}", timeout_s=WAIT_S,
                             interval_s=0.005)  # fmt: skip


async def test_a_small_job_behind_a_big_one_finishes_in_its_share(tmp_path: Path) -> None:
    config = JobsConfig(job_store_url=f"sqlite://{tmp_path / 'jobs.sqlite3'}",
                        object_store_url=str(tmp_path / "objects"), worker_id="w",
                        num_shard_runners=2, lines_per_shard=10, poll_every_s=0.01,
                        renew_every_s=0.05, lease_s=5)  # fmt: skip
    endpoint = GatedEndpoint()
    jobs = JobsSubsystem(config, tmp_path, endpoint, lambda name: name == "m",
                         fair_share=FairShare(half_life_s=3600))  # fmt: skip
    await jobs.start()
    try:
        big = await wait_status(jobs, await submit(jobs, "a", BIG_LINES), BatchStatus.IN_PROGRESS)
        small = await submit(jobs, "b", SMALL_LINES)
        await wait_status(jobs, small, BatchStatus.IN_PROGRESS)
        endpoint.release.set()
        await wait_status(jobs, small, BatchStatus.COMPLETED)
        big = await jobs.api.get_batch("a", big.id)
        # B's 5 shards alternate with A's; without fair shares B would wait for all 100 of A's.
        assert big.request_counts.completed <= 200, big.request_counts
        await wait_status(jobs, big, BatchStatus.COMPLETED)
    finally:
        await jobs.stop()


async def test_a_tenant_over_its_budget_keeps_its_batch_in_progress(tmp_path: Path) -> None:
    config = JobsConfig(job_store_url=f"sqlite://{tmp_path / 'jobs.sqlite3'}",
                        object_store_url=str(tmp_path / "objects"), worker_id="w",
                        lines_per_shard=10, poll_every_s=0.01, renew_every_s=0.05, lease_s=5)  # fmt: skip
    endpoint = GatedEndpoint()
    endpoint.release.set()
    jobs = JobsSubsystem(config, tmp_path, endpoint, lambda name: name == "m",
                         budgets=MonthlyBudgets({"b": 1.0}, refresh_s=0.01))  # fmt: skip
    await jobs.start()
    try:
        now_s = time.time()
        usage = UsageRow("b", "m", month_start_s(now_s), 1, 10, 0, 60.0, 1.0)
        jobs.context.store.blocking.add_usage([usage])
        over = await wait_status(jobs, await submit(jobs, "b", 20), BatchStatus.IN_PROGRESS)
        await wait_status(jobs, await submit(jobs, "a", 20), BatchStatus.COMPLETED)
        over = await jobs.api.get_batch("b", over.id)
        assert over.status is BatchStatus.IN_PROGRESS and over.request_counts.completed == 0
        jobs.budgets.budgets_usd["b"] = 2.0  # raised: its lines run again
        await wait_status(jobs, over, BatchStatus.COMPLETED)
    finally:
        await jobs.stop()
