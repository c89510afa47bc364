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

The whole calibration keeps to a budget (``--calibrate-budget-s``, 2 minutes by default,
see ``pace``): on a slow model the lone requests and the pairs are fewer and the batch sizes
stop doubling sooner, and every step reports its progress with an estimate of the rest.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conveyor.plan.curves import LinearCurve
from conveyor.plan.pace import DEFAULT_BUDGET_S, Pace, loop_now

REPEATS = 3
SOLO_REQUESTS = 60
OVERLAP_PAIRS = 12
# Within the budget: at least this many, and at most these shares of the time left.
MIN_SOLO, MIN_PAIRS = 5, 3
SOLO_SHARE, OVERLAP_SHARE = 0.3, 0.25
# A batch twice as large takes at most this many times as long (its steps are shared).
GROWTH = 1.6
# Batch sizes an estimate of the time left counts on (1, 2, 4, 8).
PROBED_SIZES = 4
PROGRESS_EVERY = 10
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
    probe: Probe, prompt_tokens: int, max_probe: int, pace: Pace | None = None
) -> OneShotCalibration:
    """Batch time against batch size, doubling the request size until it splits (or the
    next size would not finish within the budget)."""
    pace = pace or Pace()
    points: list[tuple[float, float]] = []
    max_batch, size = 1, 1
    while size <= max_probe:
        started_s = pace.now()
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
        took_s = pace.now() - started_s
        pace.estimate_left_s = _doubling_left_s(size, max_probe, took_s)
        pace.say("1/1 batches", f"{size} input(s) a request, {took_s:.2f} s")
        if num_batches > 1:  # the request was split: its cap is below this size
            break
        if size > 1 and not _next_fits(pace, took_s):
            pace.say("1/1 batches", f"stopped before {size * 2}: the budget")
            break
        size *= 2
    return OneShotCalibration(LinearCurve.fit(points), max_batch, points)


def _doubling_left_s(size: int, max_probe: int, took_s: float) -> float:
    """What the sizes after ``size`` would take, each ``GROWTH`` times the one before."""
    left, step_s = 0.0, took_s
    while size * 2 <= max_probe:
        size *= 2
        step_s *= GROWTH
        left += step_s
    return left


def _next_fits(pace: Pace, took_s: float) -> bool:
    """Whether the next, larger size should finish before the budget is spent."""
    return took_s * GROWTH <= pace.left_s


async def solo_times(
    probe: Probe, prompt_tokens: int, output_tokens: int, pace: Pace | None = None
) -> SoloTimes:
    """Completions one at a time (``SOLO_REQUESTS``, or what ``SOLO_SHARE`` of the budget
    holds, at least ``MIN_SOLO``), timed by the caller and by the engine."""
    pace = pace or Pace()
    before = await probe.samples()
    caller_s: list[float] = []
    target = SOLO_REQUESTS
    while len(caller_s) < target:
        started = pace.now()
        await probe.complete(prompt_tokens, output_tokens)
        caller_s.append(pace.now() - started)
        mean_s = statistics.fmean(caller_s)
        if len(caller_s) == MIN_SOLO:
            target = pace.repeats(SOLO_SHARE, mean_s, MIN_SOLO, SOLO_REQUESTS)
        if len(caller_s) in (1, target) or len(caller_s) % PROGRESS_EVERY == 0:
            pace.estimate_left_s = _generative_left_s(mean_s, target - len(caller_s))
            pace.say("1/3 lone requests", f"{len(caller_s)}/{target}, {mean_s:.3f} s each")
    after = await probe.samples()
    # Arrival to first token, plus every gap after it: arrival to the last token.
    engine_s = probe.delta(before, after, "conveyor_time_to_first_token_seconds_sum")
    engine_s += probe.delta(before, after, "conveyor_time_per_output_token_seconds_sum")
    num = probe.delta(before, after, "conveyor_time_to_first_token_seconds_count")
    return SoloTimes(caller_s, engine_s / max(1.0, num))


def _generative_left_s(request_s: float, solo_left: int, pairs: int = OVERLAP_PAIRS) -> float:
    """The rest of a generative calibration: lone requests, pairs (each about one and a
    half requests long) and ``REPEATS`` rounds of each batch size (about a request each)."""
    return request_s * (solo_left + 1.5 * pairs + REPEATS * PROBED_SIZES)


async def overlap_cost_s(
    probe: Probe, prompt_tokens: int, output_tokens: int, solo_mean_s: float,
    pairs: int = OVERLAP_PAIRS,
) -> float:  # fmt: skip
    """What one other request running alongside adds to a caller's time (median of pairs).

    The second request of a pair starts halfway through the first: each sees half of the
    other (its arrival, or its answer), so a whole overlap costs twice their excess over a
    lone request.
    """

    async def timed(delay_s: float) -> float:
        await asyncio.sleep(delay_s)
        started = loop_now()
        await probe.complete(prompt_tokens, output_tokens)
        return loop_now() - started

    excess = []
    for _ in range(pairs):
        first, second = await asyncio.gather(timed(0.0), timed(solo_mean_s / 2))
        excess.append((first + second) / 2 - solo_mean_s)
    return max(0.0, 2 * statistics.median(excess))


async def calibrate_generative(
    probe: Probe, prompt_tokens: int, output_tokens: int, max_probe: int,
    pace: Pace | None = None,
) -> GenerativeCalibration:  # fmt: skip
    """Mean time per output token at 1, 2, 4... running sequences; prefill at one."""
    pace = pace or Pace()
    solo = await solo_times(probe, prompt_tokens, output_tokens, pace)
    mean_s = statistics.fmean(solo.caller_s)
    pairs = pace.repeats(OVERLAP_SHARE, 1.5 * mean_s, MIN_PAIRS, OVERLAP_PAIRS)
    pace.estimate_left_s = _generative_left_s(mean_s, 0, pairs)
    pace.say("2/3 overlapping pairs", f"{pairs} pairs")
    overlap = await overlap_cost_s(probe, prompt_tokens, output_tokens, mean_s, pairs)
    points, prefill, size = await _batch_sizes(probe, prompt_tokens, output_tokens,
                                               max_probe, pace)  # fmt: skip
    return GenerativeCalibration(
        LinearCurve.fit(points), prefill, size, points,
        overhead_s=solo.overhead_s, tail_s=solo.tail_s, overlap_s=overlap,
    )  # fmt: skip


async def _batch_sizes(
    probe: Probe, prompt_tokens: int, output_tokens: int, max_probe: int, pace: Pace
) -> tuple[list[tuple[float, float]], float, int]:
    """(running sequences, seconds a token) at 1, 2, 4...; the prefill at one; the largest
    size run. Stops doubling when the next size would not finish in the budget (1 and 2
    always run: a line needs two)."""
    points: list[tuple[float, float]] = []
    ttfts: list[float] = []
    size = largest = 1
    while size <= max_probe:
        largest = size
        started_s = pace.now()
        before = await probe.samples()
        for _ in range(REPEATS):
            await asyncio.gather(*(probe.complete(prompt_tokens, output_tokens)
                                   for _ in range(size)))  # fmt: skip
        after = await probe.samples()
        tpot_n = probe.delta(before, after, "conveyor_time_per_output_token_seconds_count")
        tpot_s = probe.delta(before, after, "conveyor_time_per_output_token_seconds_sum")
        if size == 1:
            ttft_n = probe.delta(before, after, "conveyor_time_to_first_token_seconds_count")
            ttft_s = probe.delta(before, after, "conveyor_time_to_first_token_seconds_sum")
            ttfts.append(ttft_s / max(1.0, ttft_n))
        if tpot_n >= 1:
            points.append((float(size), tpot_s / tpot_n))
        took_s = pace.now() - started_s
        pace.estimate_left_s = _doubling_left_s(size, max_probe, took_s)
        pace.say("3/3 batches", f"{size} at once, {took_s:.2f} s")
        if size > 1 and not _next_fits(pace, took_s) and size * 2 <= max_probe:
            pace.say("3/3 batches", f"stopped before {size * 2} at once: the budget")
            break
        size *= 2
    # The first token comes out of the prefill pass itself: TTFT alone is the prefill.
    prefill = statistics.median(ttfts) if ttfts else 0.0
    return points, prefill, largest


async def calibrate(
    url: str, model: str, prompt_tokens: int, output_tokens: int, *,
    max_probe: int, headers: Mapping[str, str] | None = None,
    budget_s: float = DEFAULT_BUDGET_S, report: Callable[[str], None] | None = None,
) -> OneShotCalibration | GenerativeCalibration:  # fmt: skip
    """Measure ``model`` at ``url`` within ``budget_s`` (progress lines to ``report``);
    which curve depends on the kind of model it is."""
    async with httpx.AsyncClient(base_url=url, headers=dict(headers or {}), timeout=120) as client:
        probe = Probe(client, model)
        pace = Pace(budget_s, report)
        if await probe.is_generative():
            pace.say("of a generative model", f"budget {budget_s:.0f} s")
            return await calibrate_generative(probe, prompt_tokens, output_tokens, max_probe,
                                              pace)  # fmt: skip
        pace.say("of a one-shot model", f"budget {budget_s:.0f} s")
        return await calibrate_one_shot(probe, prompt_tokens, max_probe, pace)
