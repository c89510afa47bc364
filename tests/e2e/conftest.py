"""Real `conveyor serve` processes on loopback, driven over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.exit_report import exit_report
from tests.polling import until

SYNTHETIC = {
    "name": "syn",
    "kind": "synthetic",
    "max_batch_size": 16,
    "max_wait_ms": 2,
    "max_queue": 1000,
    "timeout_ms": 30000,
    "batch_latency_ms": 5,
    "dim": 8,
    "max_input_tokens": 64,
    "fail_marker": "POISON",
    "oom_above": 8,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running server process and its address."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    def metric(self, name: str, **labels: str) -> float:
        """One sample from /metrics (0 if absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    def log(self) -> str:
        return self.log_path.read_text()


def start_server(tmp: Path, config: dict[str, Any], *, ready_timeout_s: float = 90) -> Server:
    """Start `conveyor serve` with ``config`` and wait until /ready answers 200."""
    return wait_until_ready(launch_server(tmp, config), ready_timeout_s)


def launch_server(tmp: Path, config: dict[str, Any]) -> Server:
    """Start `conveyor serve` with ``config``, not waiting for it (see `wait_until_ready`)."""
    port = free_port()
    config_path = tmp / "conveyor.yaml"
    config_path.write_text(yaml.safe_dump({**config, "data_dir": str(tmp / "data")}))
    log_path = tmp / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", "--config", str(config_path),
             "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    return Server(f"http://127.0.0.1:{port}", process, log_path)


def wait_until_ready(server: Server, ready_timeout_s: float = 90) -> Server:
    """Wait until the server's /ready answers 200; shut it down if it does not in time."""
    process = server.process

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(exit_report("server", process.returncode, server.log()))
        return httpx.get(f"{server.url}/ready", timeout=1).status_code == 200

    try:
        until(ready, lambda: f"the server to be ready:\n{server.log()}",
              timeout_s=ready_timeout_s, interval_s=0.1, ignoring=(httpx.TransportError,))  # fmt: skip
    except BaseException:
        stop_server(server)
        raise
    return server


def stop_server(server: Server) -> None:
    """SIGTERM, then SIGKILL if it does not exit."""
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="session")
def main_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Synthetic and the real MiniLM model in one server, shared by the session."""
    tmp = tmp_path_factory.mktemp("main-server")
    config = {
        "models": [
            SYNTHETIC,
            {"name": "all-MiniLM-L6-v2", "kind": "embedding", "max_batch_size": 32},
        ]
    }
    server = start_server(tmp, config)
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``conveyor serve`` with no model configured (MiniLM and SmolLM2), shared by every test."""
    server = start_server(tmp_path_factory.mktemp("defaults"), {}, ready_timeout_s=300)
    yield server
    stop_server(server)


@pytest.fixture()
def server_factory(tmp_path: Path) -> Iterator[Any]:
    """Start servers with custom configs; all are stopped after the test."""
    started: list[Server] = []

    def make(config: dict[str, Any]) -> Server:
        sub = tmp_path / f"s{len(started)}"
        sub.mkdir()
        server = start_server(sub, config)
        started.append(server)
        return server

    yield make
    for server in started:
        stop_server(server)
