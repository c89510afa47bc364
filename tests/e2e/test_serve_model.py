"""``conveyor serve DIR`` with no config file: a cross-encoder directory is served as a rerank
model under the name given, with an API key, reachable through the official client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from conveyor.fakes.checkpoints import build_tiny_cross_encoder
from tests.e2e.conftest import Server, free_port, stop_server
from tests.polling import until

pytestmark = pytest.mark.slow

KEY = "sk-e2e-0123456789"


def test_serve_a_directory_without_a_config_file(tmp_path: Path) -> None:
    model_dir = build_tiny_cross_encoder(tmp_path / "ce")
    port = free_port()
    log_path = tmp_path / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CONVEYOR_DATA_DIR": str(tmp_path / "data")}
    command = [sys.executable, "-m", "conveyor", "serve", str(model_dir), "--port", str(port),
               "--served-model-name", "ranker", "--api-key", KEY, "--max-batch-size", "4"]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:

        def ready() -> bool:
            assert process.poll() is None, server.log()
            return _ready(server)

        until(ready, lambda: f"the server to be ready:\n{server.log()}", timeout_s=90,
              interval_s=0.1)  # fmt: skip
        client = openai.OpenAI(base_url=server.api, api_key=KEY, max_retries=0)
        assert client.models.retrieve("ranker").id == "ranker"
        headers = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "ranker", "query": "the cat", "documents": ["the cat sat", "a dog"]}
        answer = httpx.post(f"{server.api}/rerank", json=body, headers=headers)
        assert answer.status_code == 200 and len(answer.json()["results"]) == 2
        assert httpx.post(f"{server.api}/rerank", json=body).status_code == 401
    finally:
        stop_server(server)


def _ready(server: Server) -> bool:
    try:
        return httpx.get(f"{server.url}/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
