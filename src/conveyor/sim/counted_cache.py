"""Which free KV blocks of a counted worker still hold a preempted sequence's prefix.

The block manager keeps computed full blocks findable after they are freed: a preempted
sequence readmitted finds the head of its tokens still cached and recomputes only the
rest. Free blocks are handed out in a fixed order (``BlockManager._take_fresh``): blocks
holding nothing findable first, then cached ones, released longest ago first, a
sequence's blocks released tail first. This keeps that order as counts: the free blocks
holding nothing, then a queue of released runs (whose sequence, how many blocks left).
Prompts are taken to share nothing (``counted_worker`` refuses scenarios where they do),
so only a preempted sequence's own run is ever found again.
"""

from __future__ import annotations

from collections import deque

NOBODY = -1


class FreeBlocks:
    """The free pool's hand-out order (see the module docstring)."""

    def __init__(self, num_blocks: int) -> None:
        self.uncached = num_blocks
        self._runs: deque[list[int]] = deque()  # [owner's arrival or NOBODY, blocks left]
        self._by_owner: dict[int, list[int]] = {}

    @property
    def num_cached(self) -> int:
        """Free blocks holding findable content."""
        return sum(run[1] for run in self._runs)

    def release(self, owner: int, cached: int, uncached: int) -> None:
        """Blocks freed: ``cached`` full computed ones (found again by ``owner``'s
        readmission; NOBODY: by nobody) and ``uncached`` others."""
        self.uncached += uncached
        if cached:
            run = [owner, cached]
            self._runs.append(run)
            if owner != NOBODY:
                self._by_owner[owner] = run

    def take(self, count: int) -> None:
        """Hand out ``count`` free blocks: those holding nothing, then the oldest cached
        (the tail of a run first, so what is left of it is still its head)."""
        used = min(count, self.uncached)
        self.uncached -= used
        count -= used
        runs = self._runs
        while count:
            run = runs[0]
            if run[1] > count:
                run[1] -= count
                return
            count -= run[1]
            run[1] = 0
            runs.popleft()
            if self._by_owner.get(run[0]) is run:
                del self._by_owner[run[0]]

    def cached_for(self, owner: int) -> int:
        """Blocks of ``owner``'s run still cached."""
        run = self._by_owner.get(owner)
        return 0 if run is None else run[1]

    def revive(self, owner: int) -> int:
        """``owner`` is readmitted: its cached blocks leave the free pool; how many."""
        run = self._by_owner.pop(owner, None)
        if run is None:
            return 0
        count, run[1] = run[1], 0
        return count
