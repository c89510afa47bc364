"""The virtual clock: a heap of timed callbacks, run in time order, nothing else.

No threads, no sleeps, no sockets: ``run`` pops the earliest event, moves ``now`` to it and
calls it. Events at the same time run in the order they were scheduled (a sequence number
breaks ties), so a run is a pure function of the scenario and the seed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class Timer:
    """A scheduled callback that can be cancelled before it runs."""

    __slots__ = ("is_cancelled",)

    def __init__(self) -> None:
        self.is_cancelled = False

    def cancel(self) -> None:
        """Do not run the callback."""
        self.is_cancelled = True


class Clock:
    """Simulated seconds and the events waiting for them."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...], Timer | None]] = []
        self._seq = itertools.count()
        self.num_events = 0

    def at(self, time_s: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at ``time_s`` (now, if that is in the past)."""
        heapq.heappush(self._heap, (max(time_s, self.now), next(self._seq), fn, args, None))

    def after(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` ``delay_s`` from now."""
        self.at(self.now + delay_s, fn, *args)

    def timer(self, time_s: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """As ``at``, returning a handle that cancels it."""
        handle = Timer()
        heapq.heappush(self._heap, (max(time_s, self.now), next(self._seq), fn, args, handle))
        return handle

    @property
    def num_pending(self) -> int:
        """Events still waiting (cancelled ones included)."""
        return len(self._heap)

    def run(self, until_s: float, idle: Callable[[], bool] | None = None) -> None:
        """Run events up to ``until_s``; stop early once ``idle()`` says nothing is left."""
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until_s:
            time_s, _, fn, args, handle = pop(heap)
            if handle is not None and handle.is_cancelled:
                continue
            self.now = time_s
            self.num_events += 1
            fn(*args)
            if idle is not None and idle():
                return
        self.now = max(self.now, until_s)
