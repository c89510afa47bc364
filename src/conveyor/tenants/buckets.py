"""Token buckets, pure: a minute's allowance refills continuously over a minute.

A bucket holds at most `capacity` (the per-minute limit) and gains `capacity / 60` a second.
An admission takes from several buckets at once or from none. Settling may give back
(a refund) or take more (the level may go below zero: a debt the refill pays off first).
The Redis backend runs the same arithmetic in Lua; these functions are its reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

REFILL_WINDOW_S = 60.0
SHARE_FLOOR = 0.5  # a share is drawn only while its bucket stays at least this full


@dataclass(slots=True)
class BucketState:
    """A bucket's level as of `updated_at_s`."""

    level: float
    updated_at_s: float


@dataclass(frozen=True, slots=True)
class BucketView:
    """What the rate-limit headers show of a bucket after an admission."""

    name: str
    capacity: int
    remaining: int
    reset_s: float


class Decision:
    """An admission's outcome: taken or not, how long to wait, every bucket's level after it.

    `views` (what the headers show) are worked out only when asked for: most answers
    are admitted, and the hot path should not build what only the headers read.
    """

    __slots__ = ("asks", "headers", "is_admitted", "levels", "refused_by", "retry_after_s")

    def __init__(
        self,
        is_admitted: bool,
        retry_after_s: float,
        asks: Sequence[tuple[str, int, int]],
        levels: Sequence[float],
        refused_by: str | None = None,
    ) -> None:
        """`asks` are the `(name, capacity, amount)` buckets, `levels` theirs after the take."""
        self.is_admitted = is_admitted
        self.retry_after_s = retry_after_s
        self.asks = asks
        self.levels = levels
        self.refused_by = refused_by
        # The rate-limit headers once built (`gate.reservation_headers`): a local share's
        # view, shown by several admissions, builds them once.
        self.headers: tuple[tuple[bytes, bytes], ...] | None = None

    @property
    def views(self) -> tuple[BucketView, ...]:
        """Each bucket as the rate-limit headers show it."""
        return tuple(
            view(name, level, cap)
            for (name, cap, _), level in zip(self.asks, self.levels, strict=True)
        )


def refill_per_s(capacity: int) -> float:
    """What a bucket gains a second."""
    return capacity / REFILL_WINDOW_S


def level_at(state: BucketState | None, capacity: int, now_s: float) -> float:
    """The bucket's level at `now_s` (a new bucket is full)."""
    if state is None:
        return float(capacity)
    elapsed_s = max(0.0, now_s - state.updated_at_s)
    return min(float(capacity), state.level + elapsed_s * refill_per_s(capacity))


def seconds_until(level: float, amount: int, capacity: int) -> float:
    """Seconds until a bucket at `level` holds `amount` (0 if it does now)."""
    return max(0.0, (amount - level) / refill_per_s(capacity))


def remaining_at(level: float) -> int:
    """Whole tokens a bucket at `level` holds, as the headers say (a debt shows as 0)."""
    return math.floor(level) if level > 0 else 0


def view(name: str, level: float, capacity: int) -> BucketView:
    """The headers' view of a bucket at `level`."""
    return BucketView(name, capacity, remaining_at(level), seconds_until(level, capacity, capacity))


def take(
    states: dict[str, BucketState],
    specs: Sequence[tuple[str, int, int]],
    now_s: float,
) -> Decision:
    """Take `amount` from every `(name, capacity, amount)` bucket, or from none.

    `states` is updated in place on admission. Refused, `retry_after_s` is the wait until
    every bucket holds its amount, and `refused_by` the bucket that waits longest.
    """
    levels: list[float] = []
    wait_s, refused_by = 0.0, None
    for name, cap, amount in specs:
        level = level_at(states.get(name), cap, now_s)
        wait = seconds_until(level, amount, cap)
        if wait > wait_s:
            wait_s, refused_by = wait, name
        levels.append(level)
    if refused_by is None:
        for i, (name, _, amount) in enumerate(specs):
            levels[i] -= amount
            state = states.get(name)
            if state is None:
                states[name] = BucketState(levels[i], now_s)
            else:  # in place: no new object on the admission path
                state.level, state.updated_at_s = levels[i], now_s
    return Decision(refused_by is None, wait_s, specs, levels, refused_by)


def draw_shares(
    states: dict[str, BucketState],
    specs: Sequence[tuple[str, int, int]],
    shares: Sequence[int],
    now_s: float,
) -> list[int]:
    """After an admitted `take`, draw each bucket's share (tokens its caller will admit by
    itself) whole, if that leaves the bucket at least `SHARE_FLOOR` full; else none of it.

    Returns what was granted per bucket. Callers pass the take's `now_s`.
    """
    grants = [0] * len(specs)
    for i, ((name, cap, _), share) in enumerate(zip(specs, shares, strict=True)):
        state = states.get(name)
        level = level_at(state, cap, now_s)
        if share > 0 and level - share >= cap * SHARE_FLOOR:
            grants[i] = share
            states[name] = BucketState(level - share, now_s)
    return grants


def settle(
    states: dict[str, BucketState], name: str, capacity: int, delta: int, now_s: float
) -> None:
    """Give `delta` back to a bucket (negative: take more), capped at its capacity."""
    level = min(float(capacity), level_at(states.get(name), capacity, now_s) + delta)
    states[name] = BucketState(level, now_s)
