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


@dataclass(frozen=True, slots=True)
class Decision:
    """An admission's outcome: taken or not, how long to wait, every bucket's view."""

    is_admitted: bool
    retry_after_s: float
    views: tuple[BucketView, ...]
    refused_by: str | None = None


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


def view(name: str, level: float, capacity: int) -> BucketView:
    """The headers' view of a bucket at `level`."""
    remaining = math.floor(level) if level > 0 else 0
    return BucketView(name, capacity, remaining, seconds_until(level, capacity, capacity))


def take(
    states: dict[str, BucketState],
    specs: Sequence[tuple[str, int, int]],
    now_s: float,
) -> Decision:
    """Take `amount` from every `(name, capacity, amount)` bucket, or from none.

    `states` is updated in place on admission. Refused, `retry_after_s` is the wait until
    every bucket holds its amount, and `refused_by` the bucket that waits longest.
    """
    levels = [level_at(states.get(name), cap, now_s) for name, cap, _ in specs]
    wait_s, refused_by = 0.0, None
    for (name, cap, amount), level in zip(specs, levels, strict=True):
        wait = seconds_until(level, amount, cap)
        if wait > wait_s:
            wait_s, refused_by = wait, name
    if refused_by is None:
        for i, (name, _, amount) in enumerate(specs):
            levels[i] -= amount
            states[name] = BucketState(levels[i], now_s)
    views = tuple(
        view(name, level, cap) for (name, cap, _), level in zip(specs, levels, strict=True)
    )
    return Decision(refused_by is None, wait_s, views, refused_by)


def settle(
    states: dict[str, BucketState], name: str, capacity: int, delta: int, now_s: float
) -> None:
    """Give `delta` back to a bucket (negative: take more), capped at its capacity."""
    level = min(float(capacity), level_at(states.get(name), capacity, now_s) + delta)
    states[name] = BucketState(level, now_s)
