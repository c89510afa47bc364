"""The virtual clock: a heap of timed callbacks, run in time order, nothing else.

No threads, no sleeps, no sockets: ``run`` pops the earliest event, moves ``now`` to it and
calls it. Events at the same time run in the order they were scheduled (a sequence number
breaks ties), so a run is a pure function of the scenario and the seed.

Timers set in a *lane* (the gateway's deadline timers, one lane a traffic source: the
same timeout, so they come due in the order they are set) wait in that lane's queue and
only its first is on the heap: at 100,000 requests/s the heap had held some three million
deadlines, most of them cancelled, and every event paid for its depth. A lane's queue is
in (time, sequence) order, so merging it with the heap runs every event exactly when and
in the order the heap alone would; a timer set earlier than its lane's last goes on the
heap.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

Entry = tuple[float, int, Callable[..., Any], tuple[Any, ...], "Timer | None"]
LaneEntry = tuple[float, int, Callable[..., Any], tuple[Any, ...], "Timer"]


class Timer:
    """A scheduled callback that can be cancelled before it runs."""

    __slots__ = ("is_cancelled", "lane")

    def __init__(self, lane: deque[LaneEntry] | None = None) -> None:
        self.is_cancelled = False
        # The lane the timer waits in (None: on the heap only).
        self.lane = lane

    def cancel(self) -> None:
        """Do not run the callback."""
        self.is_cancelled = True


class Clock:
    """Simulated seconds and the events waiting for them."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[Entry] = []
        self._lanes: dict[Hashable, deque[LaneEntry]] = {}
        self._seq = itertools.count()
        self.num_events = 0

    def at(self, time_s: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at ``time_s`` (now, if that is in the past)."""
        heapq.heappush(self._heap, (max(time_s, self.now), next(self._seq), fn, args, None))

    def after(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` ``delay_s`` from now."""
        self.at(self.now + delay_s, fn, *args)

    def timer(
        self, time_s: float, fn: Callable[..., Any], *args: Any, lane: Hashable = None
    ) -> Timer:
        """As ``at``, returning a handle that cancels it; in ``lane`` when given (see the
        module docstring: the order events run in is the same either way)."""
        time_s = max(time_s, self.now)
        queue = None if lane is None else self._lanes.setdefault(lane, deque())
        if queue is not None and queue and queue[-1][0] > time_s:
            queue = None  # out of the lane's order: on the heap
        handle = Timer(queue)
        entry = (time_s, next(self._seq), fn, args, handle)
        if queue is None:
            heapq.heappush(self._heap, entry)
            return handle
        queue.append(entry)
        if len(queue) == 1:
            heapq.heappush(self._heap, entry)  # the lane's first is on the heap
        return handle

    @property
    def num_pending(self) -> int:
        """Events still waiting (cancelled ones included)."""
        waiting = sum(len(queue) for queue in self._lanes.values())
        return len(self._heap) + waiting - sum(1 for queue in self._lanes.values() if queue)

    def run(self, until_s: float, idle: Callable[[], bool] | None = None) -> None:
        """Run events up to ``until_s``; stop early once ``idle()`` says nothing is left."""
        heap = self._heap
        pop, push = heapq.heappop, heapq.heappush
        while heap and heap[0][0] <= until_s:
            time_s, _, fn, args, handle = pop(heap)
            if handle is not None:
                lane = handle.lane
                if lane is not None:
                    lane.popleft()
                    while lane and lane[0][4].is_cancelled:
                        lane.popleft()  # never to run: not worth a turn on the heap
                    if lane:
                        push(heap, lane[0])
                if handle.is_cancelled:
                    continue
            self.now = time_s
            self.num_events += 1
            fn(*args)
            if idle is not None and idle():
                return
        self.now = max(self.now, until_s)
