"""The engine thread's cores and intra-op threads."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from conveyor.engine.cpu_threads import engine_threads, pin_engine_thread


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
