"""The ``hf_static`` contender: Hugging Face transformers ``generate`` on static batches.

No server: the bench's own process loads the same Hugging Face directory in ``--dtype``
with ``--threads`` torch threads and, at each concurrency C, runs ``--num-requests`` random
prompts of ``--input-len`` tokens as consecutive batches of C (the last one smaller when C
does not divide them), each generating exactly ``--output-len`` new tokens (greedy,
``min_new_tokens = max_new_tokens``: EOS never ends a sequence early). A batch's requests
all start when it starts and share every step, so per request: TTFT is the batch's first
step (the prefill and first token), TPOT the rest of the batch over its later steps, and
ITL each decode step's time (every sequence gets its token at the same step). Requests
waiting for an earlier batch are not counted as waiting, as a served client with at most
C in flight does not count its own queue either. The chat workload has no meaning here
(there is nothing to send requests to): it is skipped with a message.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.served_clients import stream_figures
from bench.served_settings import RANDOM, Point, Settings


def batch_sizes(num: int, concurrency: int) -> list[int]:
    """The static batches ``num`` requests form at ``concurrency``."""
    full, rest = divmod(num, concurrency)
    return [concurrency] * full + ([rest] if rest else [])


def batch_token_times(started: float, step_ends: list[float], size: int) -> list[list[float]]:
    """Each request's token times (seconds from its batch's start): the batch's steps."""
    times = [end - started for end in step_ends]
    return [list(times) for _ in range(size)]


class _StepClock:
    """A stopping criterion that never stops: it notes when each generation step ends."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.ends.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class StaticBatches:
    """The model loaded once, run on static batches of random prompts."""

    def __init__(self, settings: Settings, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.settings = settings
        torch.set_num_threads(settings.threads)
        dtype = getattr(torch, settings.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        self.model.eval()
        self.vocab_size = int(self.model.config.vocab_size)
        pad = self.model.generation_config.pad_token_id
        eos = self.model.generation_config.eos_token_id
        self.pad_token_id = pad if pad is not None else (eos[0] if isinstance(eos, list) else eos)

    def run_batch(self, size: int, output_len: int, seed: int) -> list[list[float]]:
        """One batch of ``size`` random prompts; each request's token times."""
        import torch
        from transformers import StoppingCriteriaList

        generator = torch.Generator().manual_seed(seed)
        shape = (size, self.settings.input_len)
        input_ids = torch.randint(0, self.vocab_size, shape, generator=generator)
        clock = _StepClock()
        started = time.perf_counter()
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
                pad_token_id=self.pad_token_id, stopping_criteria=StoppingCriteriaList([clock]),
            )  # fmt: skip
        new_tokens = output.shape[1] - input_ids.shape[1]
        if new_tokens != output_len or len(clock.ends) != output_len:
            raise RuntimeError(f"hf_static made {new_tokens} tokens, not {output_len}")
        return batch_token_times(started, clock.ends, size)

    def run_point(self, point: Point, num: int, output_len: int) -> dict[str, Any]:
        """Every batch of one concurrency, one after another; the point's figures."""
        assert point.workload == RANDOM and point.concurrency is not None
        token_times: list[list[float]] = []
        started = time.perf_counter()
        for index, size in enumerate(batch_sizes(num, point.concurrency)):
            seed = self.settings.seed + 1000 * point.concurrency + index
            token_times += self.run_batch(size, output_len, seed)
        return stream_figures(token_times, output_len, time.perf_counter() - started)


def measure_hf_static(
    settings: Settings, model_dir: Path, log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """Load the model, warm it up on one small batch, run every random point; by label."""
    started = time.perf_counter()
    batches = StaticBatches(settings, model_dir)
    log(f"hf_static loaded in {time.perf_counter() - started:.0f} s")
    warm = min(min(settings.concurrencies), settings.num_requests)
    batches.run_batch(warm, min(settings.output_len, 8), seed=settings.seed + 7)  # discarded
    results: dict[str, dict[str, Any]] = {}
    for concurrency in settings.concurrencies:
        point = Point(RANDOM, concurrency=concurrency)
        load = os.getloadavg()[0]
        figures = batches.run_point(point, settings.num_requests, settings.output_len)
        results[point.label] = {**figures, "load_average_before": round(load, 2)}
        log(f"hf_static {point.label}: {figures['output_throughput']:.1f} tok/s (load {load:.2f})")
    return results
