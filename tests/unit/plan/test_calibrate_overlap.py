"""The overlap probe's arithmetic, on a fake server whose requests slow each other, run on
a virtual clock (so the figures are exact, not subject to this machine's timer slack)."""

from __future__ import annotations

import asyncio
import statistics
from typing import cast

import pytest

from conveyor.plan.calibrate import Probe, overlap_cost_s
from tests.virtual_time import run_virtual

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


async def measure(server: SharingServer) -> float:
    """A lone request's time (as the calibration measures it before the pairs), then the
    overlap cost against it."""
    loop = asyncio.get_running_loop()
    times = []
    for _ in range(5):
        started = loop.time()
        await server.complete(16, 8)
        times.append(loop.time() - started)
    return await overlap_cost_s(cast(Probe, server), 16, 8, statistics.median(times))


def test_twice_the_mean_excess_of_a_half_overlapping_pair_is_one_whole_overlap() -> None:
    assert run_virtual(measure(SharingServer(slowdown_s=0.004))) == pytest.approx(0.008)


def test_requests_that_do_not_slow_each_other_measure_no_overlap() -> None:
    assert run_virtual(measure(SharingServer(slowdown_s=0.0))) == pytest.approx(0.0, abs=1e-9)


def test_the_virtual_clock_moves_only_by_what_was_slept() -> None:
    async def sleeps() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(asyncio.sleep(5.0), asyncio.sleep(3.0))
        await asyncio.sleep(1.5)
        return loop.time() - started

    assert run_virtual(sleeps()) == pytest.approx(6.5)
