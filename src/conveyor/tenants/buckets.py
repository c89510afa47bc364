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
    return BucketView(
        name, capacity, max(0, math.floor(level)), seconds_until(level, capacity, capacity)
    )


def take(
    states: dict[str, BucketState],
    specs: Sequence[tuple[str, int, int]],
    now_s: float,
) -> Decision:
    """Take `amount` from every `(name, capacity, amount)` bucket, or from none.

    `states` is updated in place on admission. Refused, `retry_after_s` is the wait until
    every bucket holds its amount.
    """
    levels = {name: level_at(states.get(name), cap, now_s) for name, cap, _ in specs}
    waits = {name: seconds_until(levels[name], amount, cap) for name, cap, amount in specs}
    short = [name for name, wait in waits.items() if wait > 0]
    if short:
        views = tuple(view(name, levels[name], cap) for name, cap, _ in specs)
        refused_by = max(short, key=lambda name: waits[name])
        return Decision(False, max(waits.values()), views, refused_by)
    for name, _, amount in specs:
        levels[name] -= amount
        states[name] = BucketState(levels[name], now_s)
    return Decision(True, 0.0, tuple(view(name, levels[name], cap) for name, cap, _ in specs))


def settle(
    states: dict[str, BucketState], name: str, capacity: int, delta: int, now_s: float
) -> None:
    """Give `delta` back to a bucket (negative: take more), capped at its capacity."""
    level = min(float(capacity), level_at(states.get(name), capacity, now_s) + delta)
    states[name] = BucketState(level, now_s)
