"""The served generation benchmark's load clients.

``vllm bench serve`` from vLLM's environment runs both workloads: ``random`` (random prompts
of ``--input-len`` tokens to ``/v1/completions``, at most ``--concurrency`` in flight) and
``chat`` (the same prompts as one user message to ``/v1/chat/completions``, streamed,
arriving as a Poisson process of ``--request-rate`` per second seeded by ``--seed``); both
ask for exactly ``--output-len`` tokens with EOS ignored. Without vLLM (and in ``--smoke``)
built-in streaming clients measure the same figures on word prompts: the random one times
each request's first token and end only (its ITL p50 is its TPOT, no ITL p99), the chat
one times every streamed token.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import timed_stream
from bench.served_settings import CHAT, FIGURES, MODEL_NAME, Point, Settings, point_seed

# Distinct reasons kept of a run's failed requests.
MAX_ERRORS = 3


def vllm_client_argv(
    vllm: Path,
    settings: Settings,
    model_dir: Path,
    port: int,
    point: Point,
    num: int,
    out: Path,
    extra_body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> list[str]:
    """``vllm bench serve`` on one point: random prompts, fixed output length, EOS ignored
    (``extra_body``: fields a peer needs on top, merged into every request; ``headers``:
    HTTP headers every request carries)."""
    if point.workload == CHAT:
        shape = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
                 "--request-rate", f"{point.rate:g}", "--burstiness", "1"]  # fmt: skip
    else:
        shape = ["--backend", "openai", "--endpoint", "/v1/completions",
                 "--max-concurrency", str(point.concurrency)]  # fmt: skip
    extra = ["--extra-body", json.dumps(extra_body)] if extra_body else []
    if headers:
        extra += ["--header", *(f"{name}={value}" for name, value in headers.items())]
    return [str(vllm), "bench", "serve", *shape,
            "--base-url", f"http://127.0.0.1:{port}", "--model", MODEL_NAME,
            "--tokenizer", str(model_dir), "--dataset-name", "random",
            "--random-input-len", str(settings.input_len),
            "--random-output-len", str(settings.output_len), "--ignore-eos", *extra,
            "--num-prompts", str(num), "--seed", str(point_seed(settings.seed, point, num)),
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name, "--disable-tqdm"]  # fmt: skip


def run_vllm_client(argv: list[str], out: Path) -> dict[str, Any]:
    """One ``vllm bench serve`` run (``argv`` from ``vllm_client_argv``); its figures."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return client_figures(json.loads(out.read_text()))


def client_figures(raw: dict[str, Any]) -> dict[str, Any]:
    """The figures of a ``vllm bench serve`` result; RuntimeError when no request
    completed (its figures would read as zeros: a peer refusing every request). With the
    detailed result, also each request's send time and TTFT (``requests``)."""
    if not raw["completed"]:
        raise RuntimeError(f"no request completed ({raw.get('failed', '?')} failed)")
    figures = {"completed": raw["completed"], "failed": raw.get("failed", 0),
               **{name: raw[name] for name in FIGURES}}  # fmt: skip
    if raw.get("start_times") and raw.get("ttfts"):
        figures["requests"] = request_timings(raw["start_times"], raw["ttfts"])
    return figures


def request_timings(starts: Sequence[float], ttfts: Sequence[float]) -> list[list[float]]:
    """Each request's send time (seconds from the first send) and TTFT (ms), in send order,
    so that a tail can be traced to its wave; a failed request's TTFT is 0."""
    first = min(starts)
    rows = sorted((start - first, 1000 * ttft) for start, ttft in zip(starts, ttfts, strict=True))
    return [[round(start, 3), round(ttft, 1)] for start, ttft in rows]


def word_prompts(settings: Settings, num: int, salt: int) -> list[str]:
    """``num`` prompts of ``--input-len`` random words, the same for every contender."""
    rng = random.Random(num * 7919 + salt)
    return [" ".join(f"w{rng.randrange(1000)}" for _ in range(settings.input_len))
            for _ in range(num)]  # fmt: skip


async def builtin_client(
    port: int,
    concurrency: int,
    num: int,
    settings: Settings,
    extra_body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The random workload's figures from streamed word prompts (no tokenizer)."""
    import httpx

    prompts = word_prompts(settings, num, concurrency)
    gate = asyncio.Semaphore(concurrency)
    url = f"http://127.0.0.1:{port}"

    async def gated(client: Any, prompt: str) -> tuple[float, float]:
        async with gate:
            body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": settings.output_len,
                    "temperature": 0, "ignore_eos": True, "stream": True,
                    **(extra_body or {})}  # fmt: skip
            return await timed_stream(client, url, body)

    async with httpx.AsyncClient(timeout=600, headers=headers) as client:
        started = time.perf_counter()
        timings = await asyncio.gather(*(gated(client, prompt) for prompt in prompts))
        elapsed_s = time.perf_counter() - started
    steps = max(settings.output_len - 1, 1)
    ttfts = sorted(1000 * first for first, _ in timings)
    tpots = sorted(1000 * (total - first) / steps for first, total in timings)
    return {"completed": num, "failed": 0,
            "output_throughput": num * settings.output_len / elapsed_s,
            "p50_ttft_ms": pct(ttfts, 0.5), "p99_ttft_ms": pct(ttfts, 0.99),
            "p50_tpot_ms": pct(tpots, 0.5), "p99_tpot_ms": pct(tpots, 0.99),
            "p50_itl_ms": pct(tpots, 0.5), "p99_itl_ms": None}  # fmt: skip


def pct(ordered: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def arrival_times(rate: float, num: int, seed: int) -> list[float]:
    """Seconds from the start at which ``num`` requests arrive: a Poisson process of
    ``rate`` per second (exponential gaps), the same for every contender."""
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(num):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def stream_figures(
    token_times: Sequence[Sequence[float]],
    output_len: int,
    elapsed_s: float,
    errors: Sequence[str] = (),
) -> dict[str, Any]:
    """The figures of streamed requests of ``output_len`` tokens each from the arrival
    times (seconds from its send) of each one's content chunks, as ``vllm bench serve``
    computes them: TTFT (the first chunk), TPOT (the rest of the request over its
    ``output_len - 1`` later tokens), ITL (every gap between two chunks, all requests
    pooled), output tokens/s over ``elapsed_s``. A request without a chunk failed; the
    first few distinct ``errors`` (why requests failed) are kept."""
    done = [times for times in token_times if times]
    steps = max(output_len - 1, 1)
    ttfts = sorted(1000 * times[0] for times in done)
    tpots = sorted(1000 * (times[-1] - times[0]) / steps for times in done)
    itls = sorted(1000 * (b - a) for times in done for a, b in itertools.pairwise(times))
    figures: dict[str, Any] = {"completed": len(done), "failed": len(token_times) - len(done),
                               "output_throughput": len(done) * output_len / elapsed_s}  # fmt: skip
    if errors:
        figures["errors"] = list(dict.fromkeys(errors))[:MAX_ERRORS]
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls)):
        for fraction in (0.5, 0.99):
            key = f"p{round(fraction * 100)}_{name}_ms"
            figures[key] = pct(values, fraction) if values else None
    return figures


async def _chat_stream(client: Any, url: str, body: dict[str, Any]) -> list[float]:
    """POST one streamed chat request; the arrival time of each chunk carrying content."""
    started = time.perf_counter()
    times: list[float] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line.removeprefix("data: ")).get("choices") or []
            if choices and choices[0].get("delta", {}).get("content"):
                times.append(time.perf_counter() - started)
    return times


async def builtin_chat_client(
    port: int,
    rate: float,
    num: int,
    settings: Settings,
    extra_body: dict[str, Any] | None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The chat workload's figures: word prompts as user messages, streamed, arriving at
    ``rate`` per second (seeded Poisson)."""
    import httpx

    prompts = word_prompts(settings, num, round(rate * 1000))
    arrivals = arrival_times(rate, num, settings.seed)
    url = f"http://127.0.0.1:{port}"
    errors: list[str] = []

    async def one(client: Any, prompt: str, at: float, started: float) -> list[float]:
        await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
                "max_completion_tokens": settings.output_len, "temperature": 0,
                "ignore_eos": True, "stream": True, **(extra_body or {})}  # fmt: skip
        try:
            times = await _chat_stream(client, url, body)
        except httpx.HTTPError as error:
            errors.append(f"{type(error).__name__}: {error}")
            return []
        if not times:
            errors.append("the stream ended without content")
        return times

    async with httpx.AsyncClient(timeout=600, headers=headers) as client:
        started = time.perf_counter()
        token_times = await asyncio.gather(
            *(
                one(client, prompt, at, started)
                for prompt, at in zip(prompts, arrivals, strict=True)
            )
        )
        elapsed_s = time.perf_counter() - started
    return stream_figures(token_times, settings.output_len, elapsed_s, errors)
