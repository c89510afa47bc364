"""The served generation benchmark's settings, contenders, workloads and measuring points.

Shared by ``bench.generate_served`` (the run), ``bench.served_peers`` (the servers),
``bench.served_clients`` (the load clients) and ``bench.served_hf_static`` (transformers
``generate`` in-process); pure, no I/O.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

CONVEYOR = "conveyor"
# Conveyor from another checkout (``--baseline-src``): before/after in one alternated run.
CONVEYOR_BASELINE = "conveyor_baseline"
# This checkout with the compiled decode path on (``enforce_eager: false``).
CONVEYOR_COMPILED = "conveyor_compiled"
VLLM = "vllm"
LLAMACPP = "llamacpp"
# llama.cpp's own server, ``llama-server``, with a slot per client (continuous batching).
LLAMA_SERVER = "llama_server"
# Hugging Face transformers ``generate`` on static batches, in the bench's own process.
HF_STATIC = "hf_static"
CONTENDERS = (CONVEYOR, CONVEYOR_BASELINE, CONVEYOR_COMPILED, VLLM, LLAMACPP, LLAMA_SERVER,
              HF_STATIC)  # fmt: skip
CONVEYORS = (CONVEYOR, CONVEYOR_BASELINE, CONVEYOR_COMPILED)
MODEL_NAME = "bench-model"

# Random prompts sent at once, at most ``--concurrency`` in flight (``/v1/completions``).
RANDOM = "random"
# Streamed chat requests arriving at ``--request-rate`` per second (``/v1/chat/completions``).
CHAT = "chat"
WORKLOADS = (RANDOM, CHAT)

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
    workloads: tuple[str, ...] = (RANDOM,)
    request_rates: tuple[float, ...] = (1.0,)
    seed: int = 0
    llamacpp_venv: str = ".venv-llamacpp"
    gguf: str | None = None
    llamacpp_quantized: bool = False
    llama_server_dir: str = ".llama-server"
    # conveyor_baseline with enforce_eager: false, as conveyor_compiled runs this checkout.
    baseline_compiled: bool = False


@dataclass(frozen=True, slots=True)
class Point:
    """One measurement of a contender: a workload at a concurrency (random) or a request
    rate in requests per second (chat)."""

    workload: str
    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        """Its key in the results: ``c16`` (random at 16 in flight), ``chat_r2`` (chat at
        2 requests/s); the random workload keeps the keys it always had."""
        if self.workload == CHAT:
            return f"chat_r{self.rate:g}"
        return f"c{self.concurrency}"


def points(settings: Settings) -> list[Point]:
    """Every point a contender runs, in order: each workload's concurrencies or rates."""
    found: list[Point] = []
    for workload in settings.workloads:
        if workload == CHAT:
            found += [Point(CHAT, rate=rate) for rate in settings.request_rates]
        else:
            found += [Point(RANDOM, concurrency=c) for c in settings.concurrencies]
    return found


def warm_up_points(settings: Settings) -> list[tuple[Point, int]]:
    """The discarded warm-up before a contender's runs: each workload's first point with
    a few requests (16 for random, 4 for chat)."""
    warm = []
    for workload in settings.workloads:
        first = next(point for point in points(settings) if point.workload == workload)
        warm.append((first, min(settings.num_requests, 4 if workload == CHAT else 16)))
    return warm


def point_seed(seed: int, point: Point, num: int) -> int:
    """The load client's seed for ``num`` requests at ``point``: its prompts (and chat
    arrivals) differ from every other point's and from the warm-up's, the same for every
    contender. With one seed for all, the warm-up's 16 prompts were the first 16 of c16's
    and c64 sent c16's 64 again, so a server's prefix cache served those prompts' prefill."""
    return seed + zlib.crc32(f"{point.label}/{num}".encode()) % 1_000_000
