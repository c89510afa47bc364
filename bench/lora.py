"""What serving many LoRA adapters from one base costs: output tokens/s of the same traffic
sent to the base alone, to 1 adapter, and spread over 8 and over 32 distinct adapters.

One in-process service hosts a random Llama with 32 random rank-``--rank``
adapters on q/k/v/o and gate/up/down (``max_loras_per_batch`` of them on the device at
once). Each round sends the same concurrent completion requests (``ignore_eos``, so each
makes exactly ``max_tokens`` tokens) once per case, alternating cases; request ``i`` of
case ``lora_N`` goes to adapter ``i mod N``. Reported per case: output tokens/s (median
over rounds, and of the best round, the one a shared machine disturbed least) and its
ratio to the base alone.

    .venv/bin/python -m bench.lora                    # bench-size model, a few minutes
    .venv/bin/python -m bench.lora --smoke --out DIR  # seconds, tiny model

Writes ``lora.json`` and ``lora.png`` into ``--out`` (default ``bench/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bench.common import RESULTS_DIR, machine_info, package_versions, write_json
from bench.rounds import alternate_cases, median_per_case
from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import execute
from conveyor.fakes.checkpoints import build_lora_adapter, build_tiny_llama
from conveyor.host.service import Service
from conveyor.openai_paths import COMPLETIONS

MODEL = "llama"
FIRST_ORDINARY_TOKEN = 3  # ids 0..2 are pad, BOS and EOS in the tiny tokenizer
ADAPTER_COUNTS = (1, 8, 32)
CASES = ("base", *(f"lora_{count}" for count in ADAPTER_COUNTS))


def parse_options() -> argparse.Namespace:
    """Command-line options; ``--smoke`` shrinks everything to seconds."""
    parser = argparse.ArgumentParser(description="Multi-LoRA throughput.")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny model, one round")
    parser.add_argument("--requests", type=int, default=32, help="concurrent requests")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--max-loras-per-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    opts = parser.parse_args()
    if opts.smoke:
        opts.requests, opts.prompt_tokens, opts.max_tokens, opts.rounds = 8, 8, 8, 1
    return opts


def make_adapters(base: Path, root: Path, count: int, rank: int) -> dict[str, str]:
    """``count`` adapters: one made with PEFT, the others its copies with fresh weights."""
    template = build_lora_adapter(base, root / "a0", rank=rank, alpha=2 * rank, seed=0)
    tensors = load_file(str(template / "adapter_model.safetensors"))
    adapters = {"a0": str(template)}
    for index in range(1, count):
        target = root / f"a{index}"
        target.mkdir()
        shutil.copy(template / "adapter_config.json", target / "adapter_config.json")
        generator = torch.Generator().manual_seed(index)
        fresh = {k: torch.randn(v.shape, generator=generator) * 0.1 for k, v in tensors.items()}
        save_file(fresh, str(target / "adapter_model.safetensors"))
        adapters[f"a{index}"] = str(target)
    return adapters


def model_of(case: str, index: int) -> str:
    """Which model request ``index`` of ``case`` names."""
    if case == "base":
        return MODEL
    return f"a{index % int(case.removeprefix('lora_'))}"


async def run_case(service: Service, case: str, opts: argparse.Namespace) -> dict[str, float]:
    """One round of one case: every request at once; output tokens/s."""
    vocab = service.generator(MODEL).vocab_size
    generator = torch.Generator().manual_seed(7)
    bodies = [
        {
            "model": model_of(case, index),
            "prompt": torch.randint(
                FIRST_ORDINARY_TOKEN, vocab, (opts.prompt_tokens,), generator=generator
            ).tolist(),
            "max_tokens": opts.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        for index in range(opts.requests)
    ]
    started_s = time.perf_counter()
    replies = await asyncio.gather(*(execute(service, COMPLETIONS, body) for body in bodies))
    elapsed_s = time.perf_counter() - started_s
    num_tokens = sum(reply["usage"]["completion_tokens"] for reply in replies)
    return {
        "num_output_tokens": num_tokens,
        "elapsed_s": elapsed_s,
        "output_tokens_per_s": num_tokens / elapsed_s,
    }


def server_config(checkpoint: Path, adapters: dict[str, str], opts: argparse.Namespace) -> Any:
    """One generative model with every adapter configured."""
    model = {
        "name": MODEL,
        "kind": "generate",
        "path": str(checkpoint),
        "kv_cache_tokens": 64 * 1024,
        "max_model_len": 1024,
        "max_num_seqs": max(opts.requests, 1),
        "max_num_batched_tokens": 2048,
        "threads": opts.threads,
        "lora": {
            "adapters": adapters,
            "max_loras_per_batch": opts.max_loras_per_batch,
            "max_cpu_loras": len(adapters),
            "max_rank": opts.rank,
        },
    }
    return ServerConfig.model_validate({"models": [model]})


async def measure(
    checkpoint: Path, adapters: dict[str, str], opts: argparse.Namespace
) -> dict[str, list[dict[str, float]]]:
    """Every round of every case, alternating, in one service."""
    async with Service(server_config(checkpoint, adapters, opts)) as service:
        await run_case(service, CASES[-1], opts)  # warm-up: every adapter used once
        return await alternate_cases(CASES, opts.rounds, lambda c: run_case(service, c, opts))


def summarise(rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Median tokens/s per case and each case's ratio to the base alone."""
    summary = median_per_case(rounds)
    base = summary["base"]["output_tokens_per_s"]
    # The best round too: on a shared machine it is the one least disturbed by others.
    best_base = max(r["output_tokens_per_s"] for r in rounds["base"])
    for case in CASES:
        summary[case]["over_base"] = summary[case]["output_tokens_per_s"] / base
        best = max(r["output_tokens_per_s"] for r in rounds[case])
        summary[case]["best_output_tokens_per_s"] = best
        summary[case]["best_over_base"] = best / best_base
    return summary


def write_png(path: Path, summary: dict[str, Any], opts: argparse.Namespace) -> None:
    """Tokens/s per case, labelled with the ratio to the base."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6.5, 3.5))
    values = [summary[case]["output_tokens_per_s"] for case in CASES]
    bars = axis.bar(list(CASES), values)
    for bar, case in zip(bars, CASES, strict=True):
        label = f"{summary[case]['over_base']:.2f}x"
        axis.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center")
    axis.set_ylabel("output tokens/s")
    axis.set_title(
        f"{opts.requests} concurrent requests, rank {opts.rank}, "
        f"max_loras_per_batch {opts.max_loras_per_batch}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    """Build the model and adapters, run, then write the JSON and the PNG."""
    opts = parse_options()
    with tempfile.TemporaryDirectory() as tmp:
        size = "tiny" if opts.smoke else "bench"
        checkpoint = build_tiny_llama(Path(tmp) / "llama", size=size)
        adapters = make_adapters(checkpoint, Path(tmp), max(ADAPTER_COUNTS), opts.rank)
        rounds = asyncio.run(measure(checkpoint, adapters, opts))
    summary = summarise(rounds)
    inputs = {key: value for key, value in vars(opts).items() if key != "out"}
    result = {
        "inputs": {**inputs, "is_smoke": opts.smoke, "cases": list(CASES)},
        "summary": summary,
        "rounds": rounds,
        "machine": machine_info(),
        "versions": package_versions(),
    }
    write_json(opts.out / "lora.json", result)
    write_png(opts.out / "lora.png", summary, opts)
    print(json.dumps({case: round(summary[case]["over_base"], 3) for case in CASES}))


if __name__ == "__main__":
    main()
