"""The batcher's clocks, to the instant: a deadline passing mid-run, the predicted wait's
edge and the running batch's age, the cycle time it learns, ``max_wait_ms`` and the window
in which online traffic counts as present.

The batcher reads two clocks: the loop's (deadlines, waits) and the monotonic clock of its
module (how long the running batch has held the model). Here the first is held still for
a synchronous moment or is a virtual loop's, and the second is a settable fake.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from conveyor.batching import batcher as batcher_module
from conveyor.batching.batcher import Batcher
from conveyor.errors import DeadlineExceeded, QueueFull
from conveyor.observability.metrics import Metrics
from conveyor.priority import Priority
from tests.unit.batching.test_batcher import GatedModel, settings, submit
from tests.virtual_time import run_virtual

pytestmark = pytest.mark.anyio


class Monotonic:
    """A settable stand-in for ``time.monotonic`` in the batcher's module."""

    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def monotonic(monkeypatch: pytest.MonkeyPatch) -> Iterator[Monotonic]:
    clock = Monotonic()
    fake_time = SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter)
    monkeypatch.setattr(batcher_module, "time", fake_time)
    yield clock


def started(run: Any, **kw: Any) -> Batcher:
    batcher = Batcher("m", run, settings(**kw), Metrics().for_model("m"))
    batcher.start()
    return batcher


@pytest.fixture
async def make_batcher() -> AsyncIterator[Callable[..., tuple[Batcher, None]]]:
    """Started batchers on gated models, let through and stopped after the test."""
    made: list[tuple[Batcher, GatedModel]] = []

    def make(model: GatedModel, **kw: Any) -> tuple[Batcher, None]:
        batcher = started(model, **kw)
        made.append((batcher, model))
        return batcher, None

    yield make
    for batcher, model in made:
        model.open_forever()
        await batcher.stop()


async def test_an_input_whose_deadline_passes_while_it_runs_gets_504_then(
    make_batcher: Any,
) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1, max_wait_ms=0)
    item = submit(batcher, "slow", timeout_s=0.05)
    await model.wait_started()
    with pytest.raises(DeadlineExceeded, match="while it ran"):
        await item.future  # the model still holds it
    model.open_forever()
    assert await submit(batcher, "next").future == "out:next"


async def test_the_predicted_wait_counts_the_running_batchs_age_to_the_instant(
    make_batcher: Any, monotonic: Monotonic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 s batches of two; one has run 0.75 s: an input waits 0.25 s, then 1 s for its own.
    A deadline exactly that far away is met; one a microsecond sooner is not."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=2, max_wait_ms=0)
    for _ in range(5):
        batcher.timing.observe(2, 1.0)
    blockers = [submit(batcher, "blocker-0"), submit(batcher, "blocker-1")]
    await model.wait_started()
    monotonic.now_s += 0.75
    loop = asyncio.get_running_loop()
    now = loop.time()
    with monkeypatch.context() as frozen:  # one instant: no await until it ends
        frozen.setattr(loop, "time", lambda: now)
        with pytest.raises(QueueFull):
            batcher.submit("too soon", 1, Priority.ONLINE, now + 1.25 - 1e-6)
        admitted = batcher.submit("just in time", 1, Priority.ONLINE, now + 1.25)
    model.open_forever()
    assert await admitted.future == "out:just in time"
    await asyncio.gather(*(item.future for item in blockers))


async def test_the_cycle_learnt_is_from_the_batchs_start_to_its_end_on_the_loop(
    make_batcher: Any, monotonic: Monotonic
) -> None:
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1, max_wait_ms=0)
    for _ in range(5):
        batcher.timing.observe(1, 0.1)
    batcher.timing.observe = lambda *args: None  # keep that fit: the gated model takes ~0 s
    item = submit(batcher, "x")
    await model.wait_started()
    monotonic.now_s += 0.3  # the batch ends, as the loop sees it, 0.3 s after it was taken
    model.release_all()
    await item.future
    assert batcher.timing.excess_s == pytest.approx(0.2)


def test_a_partial_batch_closes_exactly_max_wait_ms_after_its_oldest_input() -> None:
    """Another input 0.9995 s after the first does not close a 1000 ms batch early."""

    async def main() -> list[float | None]:
        batcher = started(lambda payloads: payloads, max_batch_size=8, max_wait_ms=1000)
        try:  # a virtual loop's clock starts at 0
            first = batcher.submit("first", 1, Priority.ONLINE, math.inf)
            await asyncio.sleep(0.9995)
            second = batcher.submit("second", 1, Priority.ONLINE, math.inf)
            await asyncio.gather(first.future, second.future)
            return [first.started_at, second.started_at]
        finally:
            await batcher.stop()

    assert run_virtual(main()) == [1.0, 1.0]


def test_online_traffic_counts_as_present_to_the_end_of_its_window() -> None:
    """Job inputs taken exactly ``online_recent_s`` after an online arrival still make a
    short job batch (the mixed-batch limit), and a moment later a full one."""

    async def main(gap_s: float) -> int:
        model = GatedModel()
        model.open_forever()
        batcher = started(model, max_batch_size=100, max_queue=1000, max_wait_ms=0,
                          online_recent_s=1.0)  # fmt: skip
        for _ in range(4):
            for size in (1, 50, 100):
                batcher.timing.observe(size, 0.02 + 0.0003 * size)
        batcher.timing.observe = lambda *args: None  # type: ignore[method-assign]
        try:
            await batcher.submit("online", 1, Priority.ONLINE, math.inf).future
            await asyncio.sleep(gap_s)  # the online input arrived at 0: now is gap_s
            jobs = [batcher.submit(f"job-{i}", 1, Priority.BATCH, math.inf) for i in range(100)]
            await asyncio.gather(*(item.future for item in jobs))
            return len(model.batches[1])
        finally:
            await batcher.stop()

    assert run_virtual(main(1.0)) == 58  # t(58) = 37.4 ms <= (20.3 + 50 + 5) / 2
    assert run_virtual(main(1.001)) == 100


def test_stop_waits_thirty_seconds_for_a_stuck_batch_by_default() -> None:
    model = GatedModel()

    async def main() -> float:
        batcher = started(model, max_batch_size=1, max_wait_ms=0)
        batcher.submit("stuck", 1, Priority.ONLINE, math.inf)
        await model.wait_started()
        stopping_at = asyncio.get_running_loop().time()
        await batcher.stop()
        return asyncio.get_running_loop().time() - stopping_at

    try:
        assert run_virtual(main()) == 30.0
    finally:
        model.open_forever()


async def test_an_input_without_a_deadline_arms_no_timer(make_batcher: Any) -> None:
    """A timer at infinity sat in the loop's heap: a virtual-time loop then jumped a day at
    a time, spinning while it waited for the model thread (the drain test above timed out)."""
    model = GatedModel()
    batcher, _ = make_batcher(model, max_batch_size=1, max_wait_ms=0)
    unbounded = batcher.submit("stuck", 1, Priority.ONLINE, math.inf)
    bounded = submit(batcher, "bounded", timeout_s=60)
    assert unbounded.timer is None
    assert bounded.timer is not None
    model.open_forever()
    assert await unbounded.future == "out:stuck"
