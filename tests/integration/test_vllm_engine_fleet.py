"""A fleet of two workers serving one model name, one on Conveyor's engine and one on vLLM's,
behind one gateway: both routable, every answer the same greedy text, each request served
once by one of them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import Server, free_port, wait_until_ready
from tests.integration.fleet.conftest import Fleet, Proc, fleet, routable_ids, store_url
from tests.integration.vllm_worker import (
    READY_TIMEOUT_S,
    spawn,
    stop_group,
    vllm_model,
    vllm_python,
)
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(1200)]

__all__ = ["fleet", "store_url"]  # fixtures, imported to be found

MODEL = "smol"
NUM_REQUESTS = 6
QUESTION = {"role": "user", "content": "What is the capital of France? Answer in one word."}


def spawn_worker(fleet: Fleet, name: str, python: str, model: dict[str, Any]) -> Proc:
    """A fleet worker in its own process group, from ``python``, starting (not yet ready)."""
    config_path = fleet.tmp / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump({"models": [model]}))
    port = free_port()
    argv = ["worker", "--config", str(config_path), "--store", fleet.store_url,
            "--listen", f"127.0.0.1:{port}", "--worker-id", name, "--heartbeat-s", "0.2",
            "--drain-timeout-s", "20"]  # fmt: skip
    log_path = fleet.tmp / f"{name}.log"
    process = spawn(python, argv, log_path)
    proc = Proc(name, f"http://127.0.0.1:{port}", process, log_path)
    fleet.procs.append(proc)
    return proc


def wait_ready(proc: Proc) -> None:
    """Wait until the worker answers /ready."""
    wait_until_ready(Server(proc.url, proc.process, proc.log_path), READY_TIMEOUT_S)


def ask(url: str) -> str:
    """A greedy chat answer from ``url`` (a worker or the gateway)."""
    response = httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
        "model": MODEL, "messages": [QUESTION], "temperature": 0, "max_tokens": 12})  # fmt: skip
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_a_conveyor_and_a_vllm_worker_behind_one_gateway(
    fleet: Fleet, smollm2_dir: Path, smollm2_path: Path
) -> None:
    import sys

    conveyor_model = {"name": MODEL, "kind": "generate", "path": str(smollm2_path),
                      "dtype": "float32", "max_model_len": 512, "max_num_seqs": 4,
                      "max_num_batched_tokens": 512, "kv_cache_tokens": 4096}  # fmt: skip
    # All three start at once: the gateway and Conveyor's engine while vLLM starts up.
    theirs = spawn_worker(fleet, "on-vllm", vllm_python(), vllm_model(smollm2_dir, name=MODEL))
    try:
        ours = spawn_worker(fleet, "on-conveyor", sys.executable, conveyor_model)
        gateway = fleet.start_gateway()
        wait_ready(ours)
        wait_ready(theirs)
        until(lambda: routable_ids(gateway) == {"on-conveyor", "on-vllm"}, "both", timeout_s=30)
        with ThreadPoolExecutor(NUM_REQUESTS) as pool:
            answers = list(pool.map(ask, [gateway.url] * NUM_REQUESTS))
        direct = {ask(ours.url), ask(theirs.url)}
        assert len(direct) == 1  # the two engines give the same greedy answer
        assert set(answers) == direct
        served = [p.metric("conveyor_requests_total", model=MODEL, outcome="ok") for p in
                  (ours, theirs)]  # fmt: skip
        assert sum(served) == NUM_REQUESTS + 2  # each request answered once, by one worker
    finally:
        stop_group(theirs.process)
