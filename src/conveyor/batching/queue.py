"""The per-model queue: priority classes, FIFO within a class, batch closing rules.

Pure logic: no asyncio waiting, no clocks of its own; callers pass ``now``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator

from conveyor.batching.item import ItemState, WorkItem
from conveyor.priority import Priority


class CloseReason(enum.Enum):
    """Why a batch was closed: the metric label values."""

    FULL = "full"
    TOKENS = "tokens"
    WAIT = "wait"


class BatchQueue:
    """Inputs waiting for a batch, online before batch, oldest first within a class.

    Dropped inputs (deadline passed, caller gone) stay in the deques as
    tombstones and are skipped; ``num_queued`` counts only live ones.
    """

    def __init__(self, *, max_batch_size: int, max_batch_tokens: int | None, max_queue: int):
        if max_batch_size < 1 or max_queue < 1:
            raise ValueError("max_batch_size and max_queue must be at least 1")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError("max_batch_tokens must be at least 1 when set")
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_queue = max_queue
        self._deques: dict[Priority, deque[WorkItem]] = {p: deque() for p in Priority}
        self._num_queued = {p: 0 for p in Priority}

    @property
    def num_queued(self) -> int:
        """Live inputs waiting, all classes."""
        return sum(self._num_queued.values())

    def num_queued_in(self, priority: Priority) -> int:
        """Live inputs waiting in one class."""
        return self._num_queued[priority]

    def num_ahead_of(self, priority: Priority) -> int:
        """Live inputs that would run before a new input of ``priority``."""
        return sum(n for p, n in self._num_queued.items() if p <= priority)

    def can_put(self, priority: Priority = Priority.ONLINE) -> bool:
        """False when that class is at its bound.

        Each class has its own bound, so a batch job that fills its share can
        never make online callers see 429.
        """
        return self._num_queued[priority] < self.max_queue

    def put(self, item: WorkItem) -> None:
        """Enqueue; the caller checks ``can_put`` first (and answers 429 if not)."""
        if not self.can_put(item.priority):
            raise OverflowError("queue is full")
        self._deques[item.priority].append(item)
        self._num_queued[item.priority] += 1

    def drop(self, item: WorkItem) -> bool:
        """Mark a queued item as gone so it never runs; False if it was not queued."""
        if not item.is_queued:
            return False
        item.state = ItemState.DONE
        self._num_queued[item.priority] -= 1
        return True

    def oldest_enqueued_at(self) -> float | None:
        """Arrival time of the longest-waiting live input, if any."""
        heads = [head.enqueued_at for head in self._live_heads()]
        return min(heads) if heads else None

    def full_reason(self, cap: int) -> CloseReason | None:
        """FULL or TOKENS if a batch taken now would be closed by size; else None."""
        _, reason = self._plan(cap)
        return reason

    def ready_reason(self, now: float, max_wait_s: float, cap: int) -> CloseReason | None:
        """The reason to close a batch at ``now``, or None to keep waiting."""
        if self.num_queued == 0:
            return None
        reason = self.full_reason(cap)
        if reason is not None:
            return reason
        oldest = self.oldest_enqueued_at()
        if oldest is not None and now - oldest >= max_wait_s:
            return CloseReason.WAIT
        return None

    def take(self, cap: int) -> tuple[list[WorkItem], CloseReason]:
        """Pop the next batch (at most ``cap`` inputs, within the token budget)."""
        count, reason = self._plan(cap)
        batch: list[WorkItem] = []
        for priority in Priority:
            dq = self._deques[priority]
            while dq and len(batch) < count:
                item = dq.popleft()
                if item.is_queued:
                    item.state = ItemState.RUNNING
                    self._num_queued[priority] -= 1
                    batch.append(item)
        return batch, reason or CloseReason.WAIT

    def _live_heads(self) -> Iterator[WorkItem]:
        for dq in self._deques.values():
            while dq and not dq[0].is_queued:
                dq.popleft()
            if dq:
                yield dq[0]

    def _iter_live(self) -> Iterator[WorkItem]:
        for priority in Priority:
            for item in self._deques[priority]:
                if item.is_queued:
                    yield item

    def _plan(self, cap: int) -> tuple[int, CloseReason | None]:
        """How many inputs the next batch takes, and whether size closed it."""
        limit = max(1, min(cap, self.max_batch_size))
        count = 0
        longest = 0
        for item in self._iter_live():
            if count == limit:
                return count, CloseReason.FULL
            longest_if_added = max(longest, item.num_tokens)
            budget = self.max_batch_tokens
            if budget is not None and count > 0 and (count + 1) * longest_if_added > budget:
                return count, CloseReason.TOKENS
            count += 1
            longest = longest_if_added
        if count == limit:
            return count, CloseReason.FULL
        budget = self.max_batch_tokens
        if budget is not None and count > 0 and (count + 1) * longest > budget:
            return count, CloseReason.TOKENS  # no further input could fit, whatever its length
        return count, None
