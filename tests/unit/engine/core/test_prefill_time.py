"""The lower bound on a prompt's prefill time, and the admission check built on it."""

from __future__ import annotations

import pytest

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.prefill_time import RECENT_STEPS, PrefillTime, check_prefill
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.sequence import Sequence
from conveyor.errors import DeadlineTooShort

BUDGET = 2048


def timed(*steps: tuple[int, float]) -> PrefillTime:
    """A record of steps, each (tokens computed, seconds), at the 2,048-token budget."""
    timing = PrefillTime()
    for num_tokens, seconds in steps:
        timing.observe(num_tokens, BUDGET, seconds)
    return timing


def test_nothing_is_known_before_a_step_of_half_the_budget() -> None:
    """Decode steps say nothing about a full step: no bound, so nobody is refused."""
    timing = timed((8, 0.05), (64, 0.06), (1023, 0.5))
    assert timing.min_prefill_s(30_000, BUDGET) is None
    assert check_prefill(timing, 30_000, BUDGET, time_left_s=0.001) is None


def test_a_prompt_needs_its_full_steps_at_the_fastest_recent_big_step() -> None:
    """30,000 tokens are 14 full steps of 2,048 (the rest may share a step): 14 x 0.4 s."""
    timing = timed((2048, 0.5), (1024, 0.4), (2048, 0.9))
    assert timing.min_prefill_s(30_000, BUDGET) == pytest.approx(14 * 0.4)
    assert timing.min_prefill_s(2047, BUDGET) == 0.0  # within one step: no bound


def test_a_smaller_budget_counts_only_steps_it_could_run() -> None:
    """After an out-of-memory halving, steps bigger than the new budget bound nothing."""
    timing = timed((2048, 0.8), (1024, 0.5))
    timing.observe(600, 1024, 0.3)  # under the halved budget
    assert timing.min_prefill_s(4096, 1024) == pytest.approx(4 * 0.3)
    assert timing.min_prefill_s(4096, 512) is None


def test_old_steps_leave_the_window() -> None:
    """A device that got slower is seen once the fast steps are RECENT_STEPS big steps old."""
    timing = timed((2048, 0.1))
    for _ in range(RECENT_STEPS - 1):
        timing.observe(2048, BUDGET, 1.0)
    assert timing.min_prefill_s(4096, BUDGET) == pytest.approx(2 * 0.1)
    timing.observe(2048, BUDGET, 1.0)
    assert timing.min_prefill_s(4096, BUDGET) == pytest.approx(2 * 1.0)


def test_a_prompt_whose_prefill_alone_passes_its_deadline_is_refused_with_400() -> None:
    """Not the load: retrying with the same deadline cannot help, so it is no 429 or 504."""
    timing = timed((2048, 0.5))
    refusal = check_prefill(timing, 30_000, BUDGET, time_left_s=5.0)
    assert isinstance(refusal, DeadlineTooShort)
    assert (refusal.status_code, refusal.code) == (400, "deadline_too_short")
    assert refusal.headers() == {}  # no Retry-After: not retryable as it is
    assert "7.0 s" in refusal.message and "5.0 s" in refusal.message
    assert check_prefill(timing, 30_000, BUDGET, time_left_s=7.5) is None


def test_the_refusal_reads_the_deadline_on_its_clock_and_none_is_never_refused() -> None:
    """40 uncached tokens in steps of 8 are 5 full steps: at least 5 s from now (t = 100)."""
    scheduler = Scheduler(SchedulerConfig(4, 8, 64), BlockManager(64, 4))
    timing = PrefillTime(clock=lambda: 100.0)
    timing.observe(8, 8, 1.0)
    seq = Sequence("a", list(range(1, 41)))
    assert timing.refusal(seq, scheduler, None) is None
    assert isinstance(timing.refusal(seq, scheduler, 104.9), DeadlineTooShort)
    assert timing.refusal(seq, scheduler, 105.0) is None
