"""The engine thread's CPU cores and intra-op threads (``threads``, ``cpu_cores``).

``cpu_cores`` pins the engine thread, and so the OpenMP threads it starts (they inherit its
affinity), to the given cores; the intra-op thread count defaults to their number. Torch
is imported only when a count is set. The process-wide OpenMP wait policy is set by the CLI
(``conveyor.cli.omp_wait``), before torch loads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["engine_threads", "pin_engine_thread"]


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
