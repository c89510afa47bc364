"""``--calibrate URL``: measure a running Conveyor model instead of trusting a preset.

The model should be otherwise idle. Figures come from the server's own ``/metrics``
(differences before and after each probe), so HTTP overhead does not pollute them:

- one-shot models: one request of n inputs per probe, n = 1, 2, 4, ... until a request is
  split into several batches (that is the model's batch cap); each probe gives
  (inputs per batch, model seconds per batch);
- generative models: n concurrent completions of the planned prompt and output length,
  n = 1, 2, 4, ...; each probe gives (n, mean time per output token), and n = 1 the prefill
  (time to first token).
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conveyor.plan.curves import LinearCurve

REPEATS = 3
# Prompts are random ids in this range (every tokenizer has them), so that no probe is
# answered from the prefix cache: a real workload's prompts differ.
TOKEN_IDS = range(3, 100)


@dataclass(frozen=True, slots=True)
class OneShotCalibration:
    """A one-shot model's measured batch-time curve and batch cap."""

    curve: LinearCurve
    max_batch: int
    points: list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class GenerativeCalibration:
    """A generative model's measured decode-step curve and prefill time."""

    step: LinearCurve
    prefill_s: float
    max_batch: int
    points: list[tuple[float, float]]


Samples = dict[tuple[str, str], float]


def parse_samples(text: str) -> Samples:
    """``(sample name, model label) -> value`` for every sample that has a model label."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is not None and len(sample.labels) == 1:
                samples[(sample.name, model)] = sample.value
    return samples


class Probe:
    """Talks to one server: scrapes its metrics and sends probe requests."""

    def __init__(self, client: httpx.AsyncClient, model: str, *, seed: int = 0) -> None:
        self.client = client
        self.model = model
        self._rng = random.Random(seed)

    def prompt(self, num_tokens: int) -> list[int]:
        """A fresh random prompt of ``num_tokens`` token ids."""
        return [self._rng.choice(TOKEN_IDS) for _ in range(num_tokens)]

    async def samples(self) -> Samples:
        """The server's metric samples now."""
        answer = await self.client.get("/metrics")
        answer.raise_for_status()
        return parse_samples(answer.text)

    def delta(self, before: Samples, after: Samples, name: str) -> float:
        """How much ``name`` of this model grew between two scrapes."""
        key = (name, self.model)
        return after.get(key, 0.0) - before.get(key, 0.0)

    async def is_generative(self) -> bool:
        """True when the server reports running sequences for the model."""
        return ("conveyor_running_sequences", self.model) in await self.samples()

    async def embed(self, num_inputs: int, prompt_tokens: int) -> None:
        """One request of ``num_inputs`` inputs of ``prompt_tokens`` token ids each."""
        body = {
            "model": self.model,
            "input": [self.prompt(prompt_tokens) for _ in range(num_inputs)],
        }
        (await self.client.post("/v1/embeddings", json=body)).raise_for_status()

    async def complete(self, prompt_tokens: int, output_tokens: int) -> None:
        """One completion of exactly ``output_tokens`` tokens."""
        body = {"model": self.model, "prompt": self.prompt(prompt_tokens),
                "max_tokens": output_tokens, "ignore_eos": True, "temperature": 0}  # fmt: skip
        (await self.client.post("/v1/completions", json=body)).raise_for_status()


async def calibrate_one_shot(
    probe: Probe, prompt_tokens: int, max_probe: int
) -> OneShotCalibration:
    """Batch time against batch size, doubling the request size until it splits."""
    points: list[tuple[float, float]] = []
    max_batch, size = 1, 1
    while size <= max_probe:
        for _ in range(REPEATS):
            before = await probe.samples()
            await probe.embed(size, prompt_tokens)
            after = await probe.samples()
            num_batches = probe.delta(before, after, "conveyor_model_seconds_count")
            inputs = probe.delta(before, after, "conveyor_batch_size_inputs_sum")
            model_s = probe.delta(before, after, "conveyor_model_seconds_sum")
            if num_batches < 1:
                raise RuntimeError(f"model {probe.model!r} ran no batch for a probe")
            points.append((inputs / num_batches, model_s / num_batches))
            max_batch = max(max_batch, round(inputs / num_batches))
        if num_batches > 1:  # the request was split: its cap is below this size
            break
        size *= 2
    return OneShotCalibration(LinearCurve.fit(points), max_batch, points)


async def calibrate_generative(
    probe: Probe, prompt_tokens: int, output_tokens: int, max_probe: int
) -> GenerativeCalibration:
    """Mean time per output token at 1, 2, 4... running sequences; prefill at one."""
    points: list[tuple[float, float]] = []
    ttfts: list[float] = []
    size = 1
    while size <= max_probe:
        before = await probe.samples()
        for _ in range(REPEATS):
            calls = (probe.complete(prompt_tokens, output_tokens) for _ in range(size))
            await asyncio.gather(*calls)
        after = await probe.samples()
        tpot_n = probe.delta(before, after, "conveyor_time_per_output_token_seconds_count")
        tpot_s = probe.delta(before, after, "conveyor_time_per_output_token_seconds_sum")
        if size == 1:
            ttft_n = probe.delta(before, after, "conveyor_time_to_first_token_seconds_count")
            ttft_s = probe.delta(before, after, "conveyor_time_to_first_token_seconds_sum")
            ttfts.append(ttft_s / max(1.0, ttft_n))
        if tpot_n >= 1:
            points.append((float(size), tpot_s / tpot_n))
        size *= 2
    step = LinearCurve.fit(points)
    # The first token comes out of the prefill pass itself: TTFT alone is the prefill.
    prefill = statistics.median(ttfts) if ttfts else 0.0
    return GenerativeCalibration(step, prefill, size // 2, points)


async def calibrate(
    url: str, model: str, prompt_tokens: int, output_tokens: int, *,
    max_probe: int, headers: Mapping[str, str] | None = None,
) -> OneShotCalibration | GenerativeCalibration:  # fmt: skip
    """Measure ``model`` at ``url``; which curve depends on the kind of model it is."""
    async with httpx.AsyncClient(base_url=url, headers=dict(headers or {}), timeout=120) as client:
        probe = Probe(client, model)
        if await probe.is_generative():
            return await calibrate_generative(probe, prompt_tokens, output_tokens, max_probe)
        return await calibrate_one_shot(probe, prompt_tokens, max_probe)
