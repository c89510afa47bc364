"""A bounded schemathesis pass over ``/openapi.json``: no generated request gets a 5xx, and
every status it gets is one the document lists for that route."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.e2e.conftest import Server, start_server, stop_server

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 25
SEED = 20261130
# Fuzzing examples per operation, except where generating one costs far more than the others:
# a message batch is a list of whole Messages requests (tens of kB each time, 0.6 s to draw).
# Five still send the route malformed lists, params and ids; the coverage phase sends it
# every boundary case of its schema (556 requests) whatever this says.
CONFIG = f"""
[generation]
max-examples = {MAX_EXAMPLES}

[[operations]]
include-name = "POST /v1/messages/batches"
generation.max-examples = 5
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = build_tiny_llama(tmp_path_factory.mktemp("fuzz-llama"))
    generate = {"name": "llama", "kind": "generate", "path": str(checkpoint), "device": "cpu",
                "kv_cache_tokens": 1024, "max_model_len": 64, "threads": 1}  # fmt: skip
    syn = {"name": "syn", "kind": "synthetic", "batch_latency_ms": 1, "dim": 8}
    running = start_server(tmp_path_factory.mktemp("fuzz-server"), {"models": [syn, generate]})
    yield running
    stop_server(running)


def test_every_route_is_documented_with_its_body(server: Server) -> None:
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    for path in ("/v1/embeddings", "/v1/completions", "/v1/chat/completions", "/v1/responses",
                 "/v1/files", "/v1/batches", "/v1/load_lora_adapter",
                 "/v1/unload_lora_adapter"):  # fmt: skip
        assert "requestBody" in paths[path]["post"], path
    for path in (
        "/v1/files",
        "/v1/batches",
        "/v1/usage",
        "/v1/responses/{response_id}/input_items",
    ):
        assert {p["name"] for p in paths[path]["get"]["parameters"]} >= {"limit"}, path


def test_no_generated_request_gets_a_server_error(server: Server, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config),
        "run", f"{server.url}/openapi.json",
        "--checks", "not_a_server_error,status_code_conformance",
        "--seed", str(SEED), "--request-timeout", "30",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
