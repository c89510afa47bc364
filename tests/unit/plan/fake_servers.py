"""Fake Conveyor models on the event loop's clock, for calibrations and loads in virtual time.

Both speak the calibration's ``Probe`` interface (requests, and the ``/metrics`` sums it
reads) and keep to the rules the plan's arithmetic assumes, exactly:

- ``FakeEngine``: continuous batching. A step runs the decodes of the ``k`` running
  sequences in ``step.at(k)``, and each sequence admitted in it adds its prefill's marginal
  cost (``prefill_s - step.fixed_s``; alone, a step of one new sequence is its prefill).
  The prefill yields the first token; at most ``max_batch`` run, the rest wait.
- ``FakeBatcher``: dynamic batching. A batch closes when full or ``max_wait_s`` after its
  oldest input arrived, runs ``curve.at(n)``; the next one waits for it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from conveyor.plan.calibrate import Probe, Samples
from conveyor.plan.curves import LinearCurve

MODEL = "fake"


def _now() -> float:
    return asyncio.get_running_loop().time()


class FakeProbe(Probe):
    """A probe whose requests go to a fake model in this process."""

    def __init__(self) -> None:
        super().__init__(cast(Any, None), MODEL)
        self.sums: dict[str, float] = {}

    def count(self, name: str, value: float) -> None:
        """Add one observation to a histogram's ``_sum`` and ``_count``."""
        self.sums[f"{name}_sum"] = self.sums.get(f"{name}_sum", 0.0) + value
        self.sums[f"{name}_count"] = self.sums.get(f"{name}_count", 0.0) + 1

    async def samples(self) -> Samples:
        """The sums a scrape would show now."""
        return {(name, MODEL): value for name, value in self.sums.items()}


@dataclass(slots=True, eq=False)
class _Sequence:
    output_tokens: int
    arrived_s: float
    done: asyncio.Future[None]
    tokens: int = 0
    last_s: float = 0.0


class FakeEngine(FakeProbe):
    """A generative model: decode steps on ``step``, prefills of ``prefill_s``."""

    def __init__(self, step: LinearCurve, prefill_s: float, max_batch: int) -> None:
        super().__init__()
        self.step, self.prefill_s, self.max_batch = step, prefill_s, max_batch
        self.sums["conveyor_running_sequences"] = 0.0
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._loop_task: asyncio.Task[None] | None = None

    async def complete(self, prompt_tokens: int, output_tokens: int) -> None:
        """One completion of ``output_tokens`` tokens."""
        seq = _Sequence(output_tokens, _now(), asyncio.get_running_loop().create_future())
        self._waiting.append(seq)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.ensure_future(self._run())
        await seq.done

    def step_s(self, running: int, admitted: int) -> float:
        """One step of ``running`` decodes and ``admitted`` prefills."""
        extra = max(0.0, self.prefill_s - self.step.fixed_s)
        shared = self.step.fixed_s + self.step.per_item_s * running + extra * admitted
        return max(self.prefill_s if admitted else 0.0, shared)

    async def _run(self) -> None:
        while self._waiting or self._running:
            room = self.max_batch - len(self._running)
            admitted, self._waiting = self._waiting[:room], self._waiting[room:]
            await asyncio.sleep(self.step_s(len(self._running), len(admitted)))
            now = _now()
            for seq in self._running:
                self.count("conveyor_time_per_output_token_seconds", now - seq.last_s)
                seq.tokens, seq.last_s = seq.tokens + 1, now
            for seq in admitted:
                self.count("conveyor_time_to_first_token_seconds", now - seq.arrived_s)
                seq.tokens, seq.last_s = 1, now
            self._running += admitted
            for seq in [s for s in self._running if s.tokens >= s.output_tokens]:
                self._running.remove(seq)
                seq.done.set_result(None)


@dataclass(slots=True, eq=False)
class _Input:
    arrived_s: float
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class FakeBatcher(FakeProbe):
    """A one-shot model: batches of up to ``max_batch`` inputs taking ``curve.at(n)``."""

    def __init__(self, curve: LinearCurve, max_batch: int, max_wait_s: float) -> None:
        super().__init__()
        self.curve, self.max_batch, self.max_wait_s = curve, max_batch, max_wait_s
        self._queue: list[_Input] = []
        self._arrived = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    async def embed(self, num_inputs: int, prompt_tokens: int) -> None:
        """One request of ``num_inputs`` inputs, answered when all have run."""
        inputs = [_Input(_now()) for _ in range(num_inputs)]
        self._queue += inputs
        self._arrived.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.ensure_future(self._run())
        await asyncio.gather(*(item.done for item in inputs))

    async def _run(self) -> None:
        while self._queue:
            close_at = self._queue[0].arrived_s + self.max_wait_s
            while len(self._queue) < self.max_batch and _now() < close_at:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), close_at - _now())
                except TimeoutError:
                    break
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            seconds = self.curve.at(len(batch))
            await asyncio.sleep(seconds)
            self.count("conveyor_model_seconds", seconds)
            self.sums["conveyor_batch_size_inputs_sum"] = self.sums.get(
                "conveyor_batch_size_inputs_sum", 0.0
            ) + len(batch)
            for item in batch:
                item.done.set_result(None)
