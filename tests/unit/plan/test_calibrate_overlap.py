"""The overlap probe's arithmetic, on a fake server whose requests slow each other."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import cast

import pytest

from conveyor.plan.calibrate import Probe, overlap_cost_s

pytestmark = pytest.mark.anyio

LONE_S = 0.02


class SharingServer:
    """A completion takes LONE_S alone; one that starts while another runs takes longer,
    and slows the running one by as much (each sees half of the other)."""

    def __init__(self, slowdown_s: float) -> None:
        self.slowdown_s = slowdown_s
        self.running: list[asyncio.Event] = []

    async def complete(self, prompt_tokens: int, output_tokens: int) -> None:
        arrived = asyncio.Event()
        for other in self.running:
            other.set()  # the running one is slowed by this arrival
        self.running.append(arrived)
        extra = self.slowdown_s if len(self.running) > 1 else 0.0
        await asyncio.sleep(LONE_S + extra)
        if arrived.is_set():
            await asyncio.sleep(self.slowdown_s)
        self.running.remove(arrived)


async def lone_s(server: SharingServer) -> float:
    """A lone request's time on the fake as the caller sees it (timer overshoot included),
    as the calibration measures it before the pairs."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        await server.complete(16, 8)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def test_twice_the_mean_excess_of_a_half_overlapping_pair_is_one_whole_overlap() -> None:
    server = SharingServer(slowdown_s=0.004)
    measured = await overlap_cost_s(cast(Probe, server), 16, 8, await lone_s(server))
    assert measured == pytest.approx(0.008, abs=0.003)  # timer slack on a busy machine


async def test_requests_that_do_not_slow_each_other_measure_no_overlap() -> None:
    server = SharingServer(slowdown_s=0.0)
    assert await overlap_cost_s(cast(Probe, server), 16, 8, await lone_s(server)) < 0.003
