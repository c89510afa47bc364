"""Batch jobs across a fleet: submitted through the gateway, run by workers, survive a SIGKILL.

The gateway serves Files and Batches on the shared PostgreSQL job store and object directory
but runs no shards; three workers run them. One worker is killed while it holds a shard
lease: the lease lapses (``lease_s`` is short) and a survivor reruns that shard, so every
custom_id still appears exactly once.
"""

from __future__ import annotations

import io
import signal
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from conveyor.stores import open_job_store
from conveyor.stores.records import ShardStatus
from tests.e2e.test_batch_api import assert_each_once, embedding_lines, jsonl, results
from tests.integration.fleet.conftest import SYNTHETIC, Fleet, routable_ids
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NUM_LINES = 2000
WAIT_S = 90.0
# ~5 ms per line on each worker: the job takes seconds, so a kill lands mid-way.
SLOW_SYNTHETIC = {**SYNTHETIC, "max_batch_size": 16, "per_item_ms": 5}
JOBS = {"lines_per_shard": 40, "poll_every_s": 0.1, "renew_every_s": 0.3, "lease_s": 2}
TERMINAL = ("completed", "failed", "expired", "cancelled")


def shared_args(tmp_path: Path) -> tuple[str, ...]:
    """The object directory every process shares, and (for the gateway) its jobs settings.

    Whichever process plans a batch sizes its shards, so the gateway gets the same ``jobs``
    section as the workers.
    """
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump({"jobs": JOBS}))
    return ("--objects", str(tmp_path / "objects"), "--config", str(config_path))


def leased_by(store_url: str, batch_id: str, worker_id: str) -> bool:
    """Whether ``worker_id`` holds a lease on some shard of the batch right now."""
    store = open_job_store(store_url)
    try:
        return any(
            shard.status is ShardStatus.LEASED and shard.lease_owner == worker_id
            for shard in store.list_shards(batch_id)
        )
    finally:
        store.close()


def finished(client: openai.OpenAI, batch_id: str) -> Any:
    """Poll the batch until it reaches a terminal status."""
    return until(
        lambda: b if (b := client.batches.retrieve(batch_id)).status in TERMINAL else None,
        f"batch {batch_id} to finish", timeout_s=WAIT_S, interval_s=0.1,
    )  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_batch_survives_a_worker_stopped_mid_job(
    fleet: Fleet, store_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGKILL: the lease lapses. SIGTERM: the drain hands the lease back before exiting."""
    objects = ("--objects", str(tmp_path / "objects"))
    config = {"models": [SLOW_SYNTHETIC], "jobs": JOBS}
    workers = [fleet.start_worker(n, config=config, extra_args=objects) for n in ("a", "b", "c")]
    gateway = fleet.start_gateway(extra_args=shared_args(tmp_path))
    until(lambda: routable_ids(gateway) == {"a", "b", "c"}, "three routable workers", timeout_s=5)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    lines = embedding_lines(NUM_LINES)
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    created = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    assert client.files.retrieve(uploaded.id).bytes == len(jsonl(lines))
    until(
        lambda: (
            leased_by(store_url, created.id, "a")
            or client.batches.retrieve(created.id).status in TERMINAL
        ),
        "a shard leased by a",
        timeout_s=WAIT_S,
    )
    assert client.batches.retrieve(created.id).status == "in_progress", gateway.log()
    workers[0].process.send_signal(sig)
    exit_code = workers[0].process.wait(timeout=30)
    if sig is signal.SIGTERM:
        assert exit_code == 0, workers[0].log()
        assert not leased_by(store_url, created.id, "a")
    batch = finished(client, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.completed == batch.request_counts.total == NUM_LINES
    outputs, errors = results(client, batch)
    assert errors == []
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    assert created.id in {b.id for b in client.batches.list()}
    # Only the survivors can have finished the job's last shards.
    assert workers[1].process.poll() is None and workers[2].process.poll() is None


def test_the_gateway_refuses_models_no_healthy_worker_serves(fleet: Fleet, tmp_path: Path) -> None:
    objects = ("--objects", str(tmp_path / "objects"))
    fleet.start_worker("a", config={"models": [SYNTHETIC], "jobs": JOBS}, extra_args=objects)
    gateway = fleet.start_gateway(extra_args=shared_args(tmp_path))
    until(lambda: routable_ids(gateway) == {"a"}, "a routable worker", timeout_s=5)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    data = jsonl(embedding_lines(3, model="nope"))
    uploaded = client.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="batch")
    created = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    batch = finished(client, created.id)
    assert batch.status == "failed"
    assert {error.code for error in batch.errors.data} == {"model_not_found"}
    assert client.files.content(uploaded.id).read() == data
    assert client.files.delete(uploaded.id).deleted
    assert uploaded.id not in {f.id for f in client.files.list()}


def test_a_batch_cancelled_through_the_gateway_ends_cancelled(fleet: Fleet, tmp_path: Path) -> None:
    objects = ("--objects", str(tmp_path / "objects"))
    config = {"models": [SLOW_SYNTHETIC], "jobs": JOBS}
    fleet.start_worker("a", config=config, extra_args=objects)
    gateway = fleet.start_gateway(extra_args=shared_args(tmp_path))
    until(lambda: routable_ids(gateway) == {"a"}, "a routable worker", timeout_s=5)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    data = jsonl(embedding_lines(NUM_LINES, prefix="cancel"))
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    created = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    # Cancel mid-job, once its lines are planned: a batch cancelled while still
    # validating has no planned lines, and its output and error files stay empty.
    until(
        lambda: client.batches.retrieve(created.id).status == "in_progress",
        "planning",
        timeout_s=WAIT_S,
    )
    assert client.batches.cancel(created.id).status in ("cancelling", "cancelled")
    batch = finished(client, created.id)
    assert batch.status == "cancelled"
    outputs, errors = results(client, batch)
    assert_each_once(outputs, errors, [f"cancel-{i}" for i in range(NUM_LINES)])
