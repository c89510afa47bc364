"""``--calibrate URL``: measure a running Conveyor model instead of trusting a preset.

The model should be otherwise idle. Figures come from the server's own ``/metrics``
(differences before and after each probe), so HTTP overhead does not pollute them:

- one-shot models: one request of n inputs per probe, n = 1, 2, 4, ... until a request is
  split into several batches (that is the model's batch cap); each probe gives
  (inputs per batch, model seconds per batch);
- generative models: n concurrent completions of the planned prompt and output length,
  n = 1, 2, 4, ...; each probe gives (n, mean time per output token), and n = 1 the prefill
  (time to first token). Before those, ``SOLO_REQUESTS`` completions one after another,
  timed by the caller too: what a caller waits beyond the engine's own time (HTTP, parsing,
  the answer), on average, is the request overhead, and how far the slowest of them lies
  above their mean is the tail this host adds to a request with nothing else running.
  Then ``OVERLAP_PAIRS`` pairs of completions, the second sent halfway through the first:
  what one other request running alongside adds to a caller's time, all in (its prefill
  and steps, and the server's and the caller's own work on its arrival and its answer,
  which share the cores and the interpreter with the engine). Synchronous bursts do not
  see that cost: their arrivals share one prefill and their answers one step.
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
SOLO_REQUESTS = 60
OVERLAP_PAIRS = 12
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
    overhead_s: float = 0.0
    tail_s: float = 0.0
    overlap_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SoloTimes:
    """Lone requests: caller-side seconds each, and the engine's mean seconds per request."""

    caller_s: list[float]
    engine_s: float

    @property
    def overhead_s(self) -> float:
        """What a caller waits beyond the engine's time, on average (never below 0)."""
        return max(0.0, statistics.fmean(self.caller_s) - self.engine_s)

    @property
    def tail_s(self) -> float:
        """How far the slowest lone request lies above the mean."""
        return max(self.caller_s) - statistics.fmean(self.caller_s)


Samples = dict[tuple[str, str], float]


def parse_samples(text: str) -> Samples:
    """``(sample name, model label) -> value`` for every sample labelled by model alone, or
    by model and priority (summed over the priority classes)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is not None and set(sample.labels) <= {"model", "priority"}:
                key = (sample.name, model)
                samples[key] = samples.get(key, 0.0) + sample.value
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


def _now() -> float:
    """The running loop's clock: what its sleeps and timeouts are measured in."""
    return asyncio.get_running_loop().time()


async def solo_times(probe: Probe, prompt_tokens: int, output_tokens: int) -> SoloTimes:
    """``SOLO_REQUESTS`` completions one at a time, timed by the caller and by the engine."""
    before = await probe.samples()
    caller_s: list[float] = []
    for _ in range(SOLO_REQUESTS):
        started = _now()
        await probe.complete(prompt_tokens, output_tokens)
        caller_s.append(_now() - started)
    after = await probe.samples()
    # Arrival to first token, plus every gap after it: arrival to the last token.
    engine_s = probe.delta(before, after, "conveyor_time_to_first_token_seconds_sum")
    engine_s += probe.delta(before, after, "conveyor_time_per_output_token_seconds_sum")
    num = probe.delta(before, after, "conveyor_time_to_first_token_seconds_count")
    return SoloTimes(caller_s, engine_s / max(1.0, num))


async def overlap_cost_s(
    probe: Probe, prompt_tokens: int, output_tokens: int, solo_mean_s: float
) -> float:
    """What one other request running alongside adds to a caller's time (median of pairs).

    The second request of a pair starts halfway through the first: each sees half of the
    other (its arrival, or its answer), so a whole overlap costs twice their excess over a
    lone request.
    """

    async def timed(delay_s: float) -> float:
        await asyncio.sleep(delay_s)
        started = _now()
        await probe.complete(prompt_tokens, output_tokens)
        return _now() - started

    excess = []
    for _ in range(OVERLAP_PAIRS):
        first, second = await asyncio.gather(timed(0.0), timed(solo_mean_s / 2))
        excess.append((first + second) / 2 - solo_mean_s)
    return max(0.0, 2 * statistics.median(excess))


async def calibrate_generative(
    probe: Probe, prompt_tokens: int, output_tokens: int, max_probe: int
) -> GenerativeCalibration:
    """Mean time per output token at 1, 2, 4... running sequences; prefill at one."""
    solo = await solo_times(probe, prompt_tokens, output_tokens)
    overlap = await overlap_cost_s(
        probe, prompt_tokens, output_tokens, statistics.fmean(solo.caller_s)
    )
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
    return GenerativeCalibration(
        step, prefill, size // 2, points,
        overhead_s=solo.overhead_s, tail_s=solo.tail_s, overlap_s=overlap,
    )  # fmt: skip


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
