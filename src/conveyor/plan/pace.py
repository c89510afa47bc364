"""How long ``--calibrate`` may take, and what it says while it runs.

A calibration has steps (lone requests, overlapping pairs, batches of 1, 2, 4...). Each
gets a share of what is left of the budget; a step that has measured a request's time sizes
its own repeats to its share (never fewer than its minimum), and the batch sizes stop
doubling when the next one would not finish in time. Each step reports one line (through
``report``, e.g. to stderr): where it is, the time spent and an estimate of what is left.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

DEFAULT_BUDGET_S = 120.0


def loop_now() -> float:
    """The running loop's clock: what its sleeps and timeouts are measured in."""
    return asyncio.get_running_loop().time()


class Pace:
    """A calibration's deadline, and its progress lines."""

    def __init__(
        self,
        budget_s: float = DEFAULT_BUDGET_S,
        report: Callable[[str], None] | None = None,
        clock: Callable[[], float] = loop_now,
    ) -> None:
        if budget_s <= 0:
            raise ValueError("the calibration budget must be > 0 seconds")
        self.budget_s = budget_s
        self._report = report
        self._clock = clock
        self._started_s = clock()
        self.estimate_left_s: float | None = None

    def now(self) -> float:
        """The clock's time."""
        return self._clock()

    @property
    def elapsed_s(self) -> float:
        """Seconds since the calibration began."""
        return self._clock() - self._started_s

    @property
    def left_s(self) -> float:
        """Seconds until the budget is spent (never below 0)."""
        return max(0.0, self.budget_s - self.elapsed_s)

    def repeats(self, share: float, each_s: float, least: int, most: int) -> int:
        """How many of a thing taking ``each_s`` fit ``share`` of the time left, in
        [``least``, ``most``]."""
        fit = math.floor(share * self.left_s / each_s) if each_s > 0 else most
        return max(least, min(most, fit))

    def say(self, step: str, detail: str) -> None:
        """One progress line: the step, what it has done, time spent, time left."""
        if self._report is None:
            return
        left = self.estimate_left_s
        shown = "estimating" if left is None else f"about {min(left, self.left_s):.0f} s left"
        self._report(f"calibrate {step}: {detail} ({self.elapsed_s:.0f} s, {shown})")
