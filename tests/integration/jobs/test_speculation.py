"""Straggler speculation end to end: two in-process workers on one store, one of them slow.

Worker "slow" hosts the synthetic model with a `slow_marker` that every line carries, so its
shard takes seconds; worker "fast" hosts the same model without the marker. The slow worker
claims the first shard alone; the fast one runs the rest, then, idle, reruns the straggler
speculatively and commits first. The slow run's late commit is refused, so every custom_id
appears exactly once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import jobs_for_service
from conveyor.host.service import Service
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.stores.records import BatchStatus, ShardStatus
from tests.integration.jobs.test_subsystem import WAIT_S, run_batch
from tests.polling import until_async

pytestmark = pytest.mark.anyio

NUM_LINES = 40  # 4 shards of 10
# A shard's 10 lines fit one model batch, so the slow worker's shard is one batch of 10 x 250 ms.
SYNTHETIC = {"name": "m", "kind": "synthetic", "max_batch_size": 16, "max_wait_ms": 50,
             "batch_latency_ms": 1}  # fmt: skip


def worker_config(tmp_path: Path, worker_id: str, **model: Any) -> ServerConfig:
    """One worker's config: the shared stores, fast polling, speculation after 0.2 s."""
    jobs = {
        "job_store_url": f"sqlite://{tmp_path / 'jobs.sqlite3'}",
        "object_store_url": str(tmp_path / "objects"),
        "worker_id": worker_id, "num_shard_runners": 1, "lines_per_shard": 10,
        "poll_every_s": 0.02, "renew_every_s": 0.05, "lease_s": 30,
        "speculation_min_running_s": 0.2,
    }  # fmt: skip
    return ServerConfig.model_validate(
        {"data_dir": tmp_path, "models": [{**SYNTHETIC, **model}], "jobs": jobs}
    )


async def started(config: ServerConfig) -> tuple[Service, JobsSubsystem]:
    """A service and its jobs subsystem, both started."""
    service = Service(config)
    await service.start()
    jobs = jobs_for_service(service)
    await jobs.start()
    return service, jobs


async def stopped(service: Service, jobs: JobsSubsystem) -> None:
    """Stop the jobs subsystem, then the service."""
    await jobs.stop()
    await service.stop()


async def test_an_idle_worker_speculates_on_a_straggler_and_wins(tmp_path: Path) -> None:
    slow = await started(worker_config(tmp_path, "slow", slow_marker="text", slow_ms=250))
    fast: tuple[Service, JobsSubsystem] | None = None
    try:
        store = slow[1].context.store.blocking
        running = asyncio.create_task(run_batch(slow[1], NUM_LINES))

        async def slow_holds_a_shard() -> bool:
            return any(s.lease_owner == "slow" for s in await _shards(store))

        await until_async(slow_holds_a_shard, "the slow worker to hold a shard",
                          timeout_s=WAIT_S, interval_s=0.01)  # fmt: skip
        # Only now does the fast worker start: the slow one holds the first shard.
        fast = await started(worker_config(tmp_path, "fast"))
        batch, outputs = await running
        shards = await _shards(store)
    finally:
        await stopped(*slow)
        if fast is not None:
            await stopped(*fast)
    assert batch.request_counts.completed == NUM_LINES and batch.error_file_id is None
    assert sorted(r["custom_id"] for r in outputs) == sorted(f"r{i}" for i in range(NUM_LINES))
    assert all(shard.status is ShardStatus.DONE for shard in shards)
    speculated = [s for s in shards if s.output_key and "speculative" in s.output_key]
    assert len(speculated) == 1 and speculated[0].index == 0


async def _shards(store: Any) -> list[Any]:
    """Every shard of the store's only batch (none before it is planned)."""
    batches = await asyncio.to_thread(store.batches_in_status, list(BatchStatus))
    if not batches:
        return []
    return list(await asyncio.to_thread(store.list_shards, batches[0].id))
