"""Conveyor processes on ``engine: vllm`` for the tests: vLLM's environment, SmolLM2 as a
Hugging Face directory, and start / stop / kill of a whole process group.

vLLM pins its own dependencies, so its engine runs in its own environment
(``make vllm-env`` builds ``.venv-vllm``, with conveyor installed from this checkout); the
tests drive it over HTTP from theirs. Without that environment the tests skip here and fail
under CI. Start-up is most of their cost: the engine, LoRA and batch modules share one server
(``vllm_launched``, a session fixture exported by ``tests/integration/conftest.py``; the
batch test SIGKILLs it mid-job and starts it again on the same data, with the LoRA module's
adapter configured, the later tests getting the new process), the fleet test starts its own
worker; all with small limits, ``enforce_eager`` (no compilation), a small KV cache.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Server, free_port, wait_until_ready
from tests.integration.smollm2_fixtures import save_random_adapter, shared_gguf_reads
from tests.missing import missing

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON_ENV = "CONVEYOR_VLLM_PYTHON"
# vLLM's start-up imports it three times (server, engine core, CPU worker), loads the
# weights and profiles memory: about a minute on two idle cores, several when they are busy.
READY_TIMEOUT_S = 900.0
VLLM_MODEL_NAME = "smol-vllm"
# The shared server's configured adapter (tests/integration/test_vllm_engine_lora.py).
LORA_ADAPTER = "random"
LORA_RANK = 8
# The shared server's batch jobs (tests/integration/test_vllm_engine_batch.py): shards of 150
# lines (its 200 lines: 150 run before its kill on the server without LoRA, 50 run again after
# it, with LoRA, at half the speed), leases renewed often and short, so a restarted server
# takes a killed one's shard soon.
VLLM_JOBS = {"lines_per_shard": 150, "poll_every_s": 0.1, "renew_every_s": 0.2, "lease_s": 2}


def vllm_python() -> str:
    """The python of the environment with vLLM and conveyor (skip, or fail under CI)."""
    path = Path(os.environ.get(VLLM_PYTHON_ENV) or REPO / ".venv-vllm" / "bin" / "python")
    if not path.is_file():
        missing(f"no vLLM environment at {path}: `make vllm-env` builds it")
    return str(path)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 as a Hugging Face directory (``conveyor models import`` of the GGUF).

    The import reads the file twice (weights, tokenizer): one parse serves both, and the
    SmolLM2 fixtures that load next (``shared_gguf_reads``)."""
    from conveyor.engine.model.gguf_import import import_gguf

    with shared_gguf_reads():
        imported = import_gguf(smollm2_path, tmp_path_factory.mktemp("smollm2-hf") / "SmolLM2")
    return imported.directory


@pytest.fixture(scope="session")
def vllm_adapter_root(smollm2_hf: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding PEFT's random rank-8 adapter of SmolLM2, named ``LORA_ADAPTER``."""
    root = tmp_path_factory.mktemp("vllm-lora")
    save_random_adapter(smollm2_hf, root / LORA_ADAPTER, rank=LORA_RANK)
    return root


class SharedVllmServer:
    """The session's one vLLM server: launched at once (its start-up overlaps other work),
    waited for by :meth:`ready`. A test may :meth:`kill` it (SIGKILL, as a machine dying
    would); the next :meth:`ready` starts it again on the same configuration and data.

    The first start has no ``lora`` section: with LoRA configured, vLLM's CPU build runs
    every step through its LoRA kernels (base requests under a null adapter,
    ``conveyor.engine.vllm_lora``), about half as fast, and the engine module and the batch
    job before its kill use the base only. :meth:`ready` given an adapter root starts the
    server again with it configured (``LORA_ADAPTER``) unless it already has it; the batch
    test's restart after its kill passes it, so the LoRA module finds it running.
    """

    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        self.tmp, self.config = tmp, config
        self._server = launch_vllm_server(tmp, config)
        self._is_down = False
        self.adapter_root: Path | None = None  # the running server's, None: no LoRA

    def ready(self, adapter_root: Path | None = None) -> Server:
        """The server once it answers: started again first if :meth:`kill` stopped it, or
        stopped and started again with LoRA if ``adapter_root`` is given and it has none."""
        if adapter_root is not None and self.adapter_root != adapter_root and not self._is_down:
            self.stop()
            self._is_down = True
        if self._is_down:
            root = adapter_root or self.adapter_root
            config = self.config if root is None else with_lora(self.config, root)
            self._server, self._is_down = launch_vllm_server(self.tmp, config), False
            self.adapter_root = root
        self._server = wait_until_vllm_ready(self._server)
        return self._server

    def kill(self) -> None:
        """SIGKILL the server and every process it started."""
        kill_group(self._server.process)
        self._is_down = True

    def stop(self) -> None:
        """SIGTERM, as at the end of the session."""
        stop_group(self._server.process)


def with_lora(config: dict[str, Any], adapter_root: Path) -> dict[str, Any]:
    """``config`` with its one model serving ``LORA_ADAPTER`` from ``adapter_root``, and
    run-time loads allowed from that directory."""
    lora = {"adapters": {LORA_ADAPTER: str(adapter_root / LORA_ADAPTER)},
            "max_loras_per_batch": 1, "max_rank": LORA_RANK,
            "load_roots": [str(adapter_root)]}  # fmt: skip
    (model,) = config["models"]
    return {**config, "models": [{**model, "lora": lora}]}


@pytest.fixture(scope="session")
def vllm_launched(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedVllmServer]:
    """The one vLLM server of the engine, LoRA and batch modules, launched, not yet ready:
    SmolLM2 (LoRA added by ``SharedVllmServer.ready``), batch jobs on ``VLLM_JOBS``."""
    config = {"models": [vllm_model(smollm2_dir)], "jobs": VLLM_JOBS}
    shared = SharedVllmServer(tmp_path_factory.mktemp("vllm-engine"), config)
    yield shared
    shared.stop()


def vllm_model(path: Path, **changes: Any) -> dict[str, Any]:
    """SmolLM2 on engine: vllm in float32 (so greedy tokens match the other engines)."""
    return {
        "name": VLLM_MODEL_NAME, "kind": "generate", "path": str(path), "engine": "vllm",
        "dtype": "float32", "max_model_len": 512, "max_num_seqs": 4,
        "max_num_batched_tokens": 512, "timeout_ms": 600_000,
        "vllm": {"enforce_eager": True, "kv_cache_memory_bytes": 128 << 20},
        **changes,
    }  # fmt: skip


def vllm_env() -> dict[str, str]:
    """The environment of a process running vLLM on the CPU."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",  # idle OpenMP threads sleep instead of spinning
        "PYTHONUNBUFFERED": "1",
    }


def spawn(python: str, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m conveyor ARGV`` in a new process group (vLLM starts children)."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [python, "-m", "conveyor", *argv], stdout=log, stderr=subprocess.STDOUT,
            env=vllm_env(), start_new_session=True, cwd=REPO,
        )  # fmt: skip


def start_vllm_server(tmp: Path, config: dict[str, Any]) -> Server:
    """``conveyor serve`` with ``config`` in vLLM's environment; wait until it is ready."""
    return wait_until_vllm_ready(launch_vllm_server(tmp, config))


def launch_vllm_server(tmp: Path, config: dict[str, Any]) -> Server:
    """``conveyor serve`` with ``config`` in vLLM's environment, starting (not yet ready:
    other work can overlap vLLM's start-up; then :func:`wait_until_vllm_ready`)."""
    port = free_port()
    config_path = tmp / "conveyor.yaml"
    config_path.write_text(yaml.safe_dump({"data_dir": str(tmp / "data"), **config}))
    log_path = tmp / "server.log"
    argv = ["serve", "--config", str(config_path), "--port", str(port)]
    process = spawn(vllm_python(), argv, log_path)
    return Server(f"http://127.0.0.1:{port}", process, log_path)


def wait_until_vllm_ready(server: Server) -> Server:
    """The launched server once it answers; killed (with its children) if it never does."""
    try:
        return wait_until_ready(server, READY_TIMEOUT_S)
    except BaseException:
        kill_group(server.process)
        raise


def metric_sum(server: Server, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` matching ``labels`` in the server's /metrics."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and every child it started (as a machine or pod dying would)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a drain, then vLLM's shutdown); the whole group is killed if it lingers."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
    kill_group(process)
