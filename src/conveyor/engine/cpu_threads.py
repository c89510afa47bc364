"""The engine thread's CPU cores and intra-op threads (``threads``, ``cpu_cores``).

``cpu_cores`` pins the engine thread, and so the OpenMP threads it starts (they inherit its
affinity), to the given cores; the intra-op thread count defaults to their number. Torch
is imported only when a count is set. The process-wide OpenMP wait policy is set by the CLI
(``conveyor.cli.omp_wait``), before torch loads. Models load on a thread of their own that
ends with the load (:func:`in_passing_thread`), so that the engine thread's OpenMP team is
the only one left.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["engine_threads", "in_passing_thread", "pin_engine_thread"]

T = TypeVar("T")


def engine_threads(threads: int | None, cpu_cores: Sequence[int] | None) -> int | None:
    """Intra-op threads for the engine: ``threads``, else one per pinned core, else None."""
    if threads is not None:
        return threads
    return len(cpu_cores) if cpu_cores else None


def pin_engine_thread(threads: int | None, cpu_cores: Sequence[int] | None) -> None:
    """On the engine thread, before its first op: pin it to ``cpu_cores`` (Linux) and set
    its intra-op thread count (OpenMP keeps one per calling thread)."""
    if cpu_cores:
        os.sched_setaffinity(0, set(cpu_cores))
    count = engine_threads(threads, cpu_cores)
    if count is not None:
        import torch

        torch.set_num_threads(count)


async def in_passing_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on a new thread (``model-load``) that ends when it returns; its
    result or error.

    libgomp (PyTorch's OpenMP on Linux) keeps a team of worker threads for every thread
    that has run a parallel op, for as long as that thread lives, and counts them all:
    once they outnumber the cores, every team's threads sleep at each barrier instead of
    spinning. A model loaded on a pool thread (``asyncio.to_thread``) left such a team
    behind, and a 16-row SmolLM2 decode step on the engine thread took 57 ms instead of
    41 ms on 2 cores (an ad-hoc run). A thread that ends takes its team with it.
    """
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to the awaiting task
            future.set_exception(exc)

    thread = threading.Thread(target=run, name="model-load", daemon=True)
    thread.start()
    try:
        return await asyncio.wrap_future(future)
    finally:
        await asyncio.to_thread(thread.join)
