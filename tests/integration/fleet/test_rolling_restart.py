"""A rolling restart of two workers under steady chat, embedding and batch load.

Each worker in turn gets SIGTERM, drains (answers new work with 503 and the drain marker,
finishes its streams, hands its shard leases back) and exits 0; a new process takes its id
and its place before the next one goes. Meanwhile clients stream chats and send embeddings
through the gateway without pause, and a batch job runs: not one request is lost or gets a
5xx, every batch line is in the output exactly once, and every chat answered is in the
usage ledger (a draining worker still writes the usage of what it finishes).

The two workers and the gateway start at once; the restarts, by their nature, one after
another. Two workers are enough for a rolling restart (one always serves while the other
goes), and a third only made the test longer by a whole restart.
"""

from __future__ import annotations

import io
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from conveyor.stores import open_job_store
from tests.e2e.test_batch_api import assert_each_once, embedding_lines, jsonl, results
from tests.integration.fleet.conftest import (
    SYNTHETIC,
    Fleet,
    Proc,
    routable_ids,
)
from tests.integration.fleet.test_batch_fleet import JOBS, finished, shared_args
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NUM_LINES = 600
# ~4 ms per line: the job lasts through the restarts.
SLOW_SYNTHETIC = {**SYNTHETIC, "max_batch_size": 16, "per_item_ms": 4}
NUM_CLIENTS = 4  # two streaming chats and two embedding callers at any moment


def chat_model(checkpoint: Path) -> dict[str, Any]:
    """A tiny random Llama served for chat (its replies are noise, their delivery is not)."""
    return {
        "name": "chat", "kind": "generate", "path": str(checkpoint), "device": "cpu",
        "max_model_len": 128, "kv_cache_tokens": 2048, "max_num_seqs": 8,
        "max_num_batched_tokens": 256, "threads": 1,
    }  # fmt: skip


class SteadyLoad:
    """Clients calling the gateway in a loop on threads until stopped; every outcome kept."""

    def __init__(self, gateway: Proc) -> None:
        self.url = gateway.url
        self.outcomes: list[tuple[str, int | str]] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(kind,), daemon=True)
            for kind in ("chat", "embed") * (NUM_CLIENTS // 2)
        ]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def failures(self) -> list[tuple[str, int | str]]:
        """Outcomes that are not a complete 200."""
        return [outcome for outcome in self.outcomes if outcome[1] != 200]

    def _loop(self, kind: str) -> None:
        with httpx.Client(timeout=30) as client:
            count = 0
            while not self._stop.is_set():
                count += 1
                try:
                    status = self._chat(client, count) if kind == "chat" else self._embed(client)
                except httpx.HTTPError as exc:
                    status = f"{type(exc).__name__}: {exc}"
                self.outcomes.append((kind, status))

    def _embed(self, client: httpx.Client) -> int | str:
        body = {"model": "syn", "input": ["a steady sentence"]}
        response = client.post(f"{self.url}/v1/embeddings", json=body)
        return response.status_code

    def _chat(self, client: httpx.Client, count: int) -> int | str:
        body = {
            "model": "chat", "messages": [{"role": "user", "content": f"turn {count}"}],
            "max_tokens": 8, "ignore_eos": True, "stream": True,
        }  # fmt: skip
        with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                return response.status_code
            lines = list(response.iter_lines())
        if "data: [DONE]" not in lines or any('"error"' in line for line in lines):
            return f"incomplete stream: {lines[-3:]}"
        return 200


def billed_requests(store_url: str, model: str) -> int:
    """Online requests of ``model`` in the fleet's usage ledger."""
    store = open_job_store(store_url)
    try:
        return sum(row.num_requests for row in store.list_usage(0) if row.model == model)
    finally:
        store.close()


def restart(fleet: Fleet, gateway: Proc, worker: Proc, config: dict[str, Any], args: Any) -> Proc:
    """SIGTERM ``worker``; once it has deregistered (out of routing), start its replacement
    under its id while it drains; it exits 0 and the replacement becomes routable."""
    worker.process.send_signal(signal.SIGTERM)
    until(lambda: worker.name not in routable_ids(gateway), f"{worker.name} out", timeout_s=15)
    replacement = fleet.spawn_worker(worker.name, config=config, extra_args=args)
    assert worker.process.wait(timeout=30) == 0, worker.log()
    fleet.wait_ready(replacement)
    until(
        lambda: worker.name in routable_ids(gateway), f"{worker.name} routable again", timeout_s=15
    )
    return replacement


def test_a_rolling_restart_loses_nothing(fleet: Fleet, tmp_path: Path) -> None:
    checkpoint = build_tiny_llama(tmp_path / "llama")
    config = {"models": [SLOW_SYNTHETIC, chat_model(checkpoint)], "jobs": JOBS}
    objects = ("--objects", str(tmp_path / "objects"))
    # The workers and the gateway load at once; the traffic starts once all answer.
    workers = [fleet.spawn_worker(name, config=config, extra_args=objects) for name in "ab"]
    gateway = fleet.spawn_gateway(extra_args=shared_args(tmp_path))
    for proc in (*workers, gateway):
        fleet.wait_ready(proc)
    until(lambda: routable_ids(gateway) == {"a", "b"}, "two routable workers", timeout_s=10)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    lines = embedding_lines(NUM_LINES)
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    with SteadyLoad(gateway) as load:
        time.sleep(0.5)
        for index, worker in enumerate(workers):
            workers[index] = restart(fleet, gateway, worker, config, objects)
        time.sleep(0.5)
    assert load.failures() == [], load.failures()[:5]
    kinds = {kind for kind, _ in load.outcomes}
    assert kinds == {"chat", "embed"} and len(load.outcomes) > 20
    done = finished(client, batch.id)
    assert done.status == "completed", done
    outputs, errors = results(client, done)
    assert errors == []
    assert_each_once(outputs, errors, [line["custom_id"] for line in lines])
    # Chat runs online only; the workers' ledgers write once a second.
    chats = sum(1 for kind, outcome in load.outcomes if kind == "chat" and outcome == 200)
    until(lambda: billed_requests(fleet.store_url, "chat") >= chats, "chats billed", timeout_s=10)
    assert billed_requests(fleet.store_url, "chat") == chats
