"""The engine thread's cores and intra-op threads."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import torch

from conveyor.engine.cpu_threads import engine_threads, in_passing_thread, pin_engine_thread
from conveyor.fakes.checkpoints import torch_threads


@pytest.mark.parametrize(
    ("threads", "cores", "expected"),
    [(None, None, None), (3, None, 3), (None, [0, 1], 2), (1, [0, 1], 1)],
)
def test_engine_threads_default_to_one_per_pinned_core(
    threads: int | None, cores: list[int] | None, expected: int | None
) -> None:
    assert engine_threads(threads, cores) == expected


def test_pinning_applies_to_the_calling_thread_only() -> None:
    first_core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    seen: dict[str, object] = {}

    def engine() -> None:
        pin_engine_thread(None, [first_core])
        seen["cores"] = os.sched_getaffinity(0)
        seen["threads"] = torch.get_num_threads()

    thread = threading.Thread(target=engine)
    thread.start()
    thread.join()
    assert seen == {"cores": {first_core}, "threads": 1}
    assert os.sched_getaffinity(0) == before


def test_no_cores_and_no_threads_change_nothing() -> None:
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    pin_engine_thread(None, None)
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == before


def os_threads() -> set[str]:
    """Ids of this process's threads, OpenMP's workers included (Linux)."""
    return set(os.listdir("/proc/self/task"))


def parallel_op() -> set[str]:
    """A torch op that runs as an OpenMP parallel region of 2 threads; the process's
    threads just after it, the calling thread's OpenMP worker among them."""
    with torch_threads(2):  # process-wide in torch: put back after
        torch.ones(1 << 21).mul(2).sum()
    return os_threads()


@pytest.mark.anyio
async def test_in_passing_thread_answers_from_a_thread_that_has_ended() -> None:
    def load(name: str) -> tuple[str, threading.Thread]:
        return name.upper(), threading.current_thread()

    answer, thread = await in_passing_thread(load, "smol")
    assert answer == "SMOL"
    assert thread is not threading.current_thread() and not thread.is_alive()


@pytest.mark.anyio
async def test_in_passing_thread_raises_what_the_function_raised() -> None:
    def broken() -> None:
        raise ValueError("no weights")

    with pytest.raises(ValueError, match="no weights"):
        await in_passing_thread(broken)


async def ended_within(threads: set[str], timeout_s: float = 5.0) -> bool:
    """Whether all of ``threads`` have ended within ``timeout_s`` (a worker released at its
    master's exit leaves a moment after)."""
    deadline = time.monotonic() + timeout_s
    while threads & os_threads():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


@pytest.mark.anyio
async def test_a_passing_thread_takes_its_openmp_team_with_it() -> None:
    before = os_threads()
    started = await in_passing_thread(parallel_op) - before
    assert len(started) >= 2  # the passing thread and its OpenMP worker
    assert await ended_within(started)


@pytest.mark.anyio
async def test_a_pool_thread_keeps_its_openmp_team() -> None:
    """Why models load on a passing thread: a pool thread lives on with an OpenMP worker
    (libgomp), which makes the engine thread's team one too many for 2 cores."""
    await asyncio.to_thread(lambda: None)  # the pool thread, made before counting
    before = os_threads()
    started = await asyncio.to_thread(parallel_op) - before
    assert started and not await ended_within(started, timeout_s=0.5)
