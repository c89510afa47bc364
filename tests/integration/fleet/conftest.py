"""Real worker and gateway processes on 127.0.0.1 sharing a fresh PostgreSQL store.

Each test gets its own database (created and dropped here) and its own processes, all
stopped afterwards. Without a reachable PostgreSQL the tests are skipped, except under
CI=true, where that is a failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.exit_report import exit_report
from tests.polling import until
from tests.postgres import fresh_database

HEARTBEAT_S = 0.2
STALE_AFTER_S = 1.0
READY_TIMEOUT_S = 60.0
MODEL = "syn"
SYNTHETIC = {
    "name": MODEL,
    "kind": "synthetic",
    "max_batch_size": 32,
    "max_wait_ms": 2,
    "max_queue": 2000,
    "batch_latency_ms": 10,
    "dim": 4,
    "max_input_tokens": 64,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proc:
    """One worker or gateway process."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` matching ``labels`` in /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def num_ok(self) -> float:
        """Requests this worker answered successfully."""
        return self.metric("conveyor_requests_total", model=MODEL, outcome="ok")


@dataclass
class Fleet:
    """Starts workers and gateways against one store; stops them all at the end."""

    store_url: str
    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    def _spawn(self, name: str, argv: list[str], port: int) -> Proc:
        log_path = self.tmp / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "conveyor", *argv],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        proc = Proc(name, f"http://127.0.0.1:{port}", process, log_path)
        self.procs.append(proc)
        return proc

    def start_worker(
        self,
        name: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        config: dict[str, Any] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> Proc:
        """Start a worker hosting the synthetic model; wait until it answers /ready."""
        proc = self.spawn_worker(
            name, heartbeat_s=heartbeat_s, config=config, extra_args=extra_args
        )
        self.wait_ready(proc)
        return proc

    def spawn_worker(
        self,
        name: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        config: dict[str, Any] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> Proc:
        """Start a worker (the synthetic model unless `config` says otherwise); do not wait."""
        config_path = self.tmp / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(config or {"models": [SYNTHETIC]}))
        port = free_port()
        return self._spawn(
            name,
            ["worker", "--config", str(config_path), "--store", self.store_url,
             "--listen", f"127.0.0.1:{port}", "--worker-id", name,
             "--heartbeat-s", str(heartbeat_s), "--drain-timeout-s", "20", *extra_args],
            port,
        )  # fmt: skip

    def start_gateway(self, name: str = "gateway", *, extra_args: tuple[str, ...] = ()) -> Proc:
        """Start a gateway; wait until it answers /ready."""
        proc = self.spawn_gateway(name, extra_args=extra_args)
        self.wait_ready(proc)
        return proc

    def spawn_gateway(self, name: str = "gateway", *, extra_args: tuple[str, ...] = ()) -> Proc:
        """Start a gateway; do not wait (it starts beside workers still loading)."""
        port = free_port()
        return self._spawn(
            name,
            ["gateway", "--store", self.store_url, "--port", str(port),
             "--stale-after-s", str(STALE_AFTER_S), "--refresh-s", "0.1", *extra_args],
            port,
        )  # fmt: skip

    def wait_ready(self, proc: Proc) -> None:
        """Wait until `proc` answers /ready; fail the test if it exits or takes too long."""

        def is_ready() -> bool:
            if proc.process.poll() is not None:
                pytest.fail(exit_report(proc.name, proc.process.returncode, proc.log()))
            return httpx.get(f"{proc.url}/ready", timeout=1).status_code == 200

        until(is_ready, lambda: f"{proc.name} to be ready:\n{proc.log()}",
              timeout_s=READY_TIMEOUT_S, ignoring=(httpx.TransportError,))  # fmt: skip

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.process.poll() is None:
                proc.process.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait()


def fleet_doc(gateway: Proc) -> dict[str, Any]:
    """The gateway's ``GET /v1/fleet``."""
    doc: dict[str, Any] = httpx.get(f"{gateway.url}/v1/fleet", timeout=5).json()
    return doc


def routable_ids(gateway: Proc) -> set[str]:
    """Ids of the workers the gateway would route to right now."""
    return {w["id"] for w in fleet_doc(gateway)["workers"] if w["is_routable"]}


def embed(client: httpx.Client, gateway: Proc, text: str, timeout_ms: int = 5000) -> httpx.Response:
    """One embeddings request through the gateway, with its deadline header."""
    return client.post(
        f"{gateway.url}/v1/embeddings",
        json={"model": MODEL, "input": [text]},
        headers={"X-Conveyor-Timeout-Ms": str(timeout_ms)},
        # The client gives up 2 s after the deadline: a hang shows up as a timeout error.
        timeout=timeout_ms / 1000 + 2,
    )


@pytest.fixture
def store_url(postgres_admin_url: str) -> Iterator[str]:
    """A brand-new database for the fleet's registry and jobs, dropped after the test."""
    with fresh_database(postgres_admin_url, prefix="conveyor_fleet") as url:
        yield url


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet factory on a fresh store; every process is stopped after the test."""
    from conveyor.stores import open_job_store

    # Migrate once up front so concurrently starting processes do not race on it.
    open_job_store(store_url).close()
    made = Fleet(store_url, tmp_path)
    try:
        yield made
    finally:
        made.stop_all()
