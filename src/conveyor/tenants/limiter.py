"""Where token buckets live: one process's memory, or Redis shared by every gateway.

Both backends take from several buckets at once or from none, and settle one bucket, with
the arithmetic of `tenants.buckets`. An admission is answered at once when the buckets (or a
local share of them, `tenants.limiter_shares`) are in memory (`take_now`), else it waits
for the backend (`take`); settlement never waits (a request's end must not wait on the
limiter): the memory backend settles at once, the Redis backend queues the settlement and
sends it with the next admissions. A backend that cannot be reached raises
`LimiterUnavailable` from `take`; what then happens (allow or deny) is the gate's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from conveyor.tenants.buckets import BucketState, Decision, draw_shares, level_at, settle, take

# (bucket name, capacity, amount to take)
BucketAsk = tuple[str, int, int]
# An admission's answer where shares were asked for: its decision, and the share granted
# per bucket (in ask order).
Granted = tuple[Decision, list[int]]


class LimiterUnavailable(Exception):
    """The limiter's backend could not be reached or did not answer in time."""


class RateLimiter(Protocol):
    """Token buckets keyed by `key` (a tenant and model) and bucket name."""

    def take_now(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision | None:
        """`take` answered at once from memory, where this limiter can (None: call `take`)."""
        ...

    async def take(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision:
        """Take every amount or none; raises LimiterUnavailable."""
        ...

    def settle(self, key: str, name: str, capacity: int, delta: int, now_s: float) -> None:
        """Give `delta` back to one bucket (negative: take more), now or soon; never raises."""
        ...

    async def close(self) -> None:
        """Send what is still queued (best effort) and release connections."""
        ...


class ShareSource(RateLimiter, Protocol):
    """A shared limiter that can also hand out shares of its buckets (`limiter_shares`)."""

    async def take_shares(
        self, key: str, asks: Sequence[BucketAsk], now_s: float, shares: Sequence[int]
    ) -> Granted:
        """As `take`, and if admitted also draw up to `shares` per bucket."""
        ...


class MemoryRateLimiter:
    """Buckets in this process's memory: exact, but each process has its own."""

    def __init__(self) -> None:
        """No bucket yet (a new bucket is full)."""
        self._buckets: dict[str, dict[str, BucketState]] = {}

    def take_now(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision:
        """Take every amount or none, always at once: the buckets are here."""
        return take(self._buckets.setdefault(key, {}), asks, now_s)

    async def take(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision:
        """As `take_now`."""
        return self.take_now(key, asks, now_s)

    async def take_shares(
        self, key: str, asks: Sequence[BucketAsk], now_s: float, shares: Sequence[int]
    ) -> Granted:
        """As `take`, drawing shares as the Redis script does (its reference)."""
        states = self._buckets.setdefault(key, {})
        decision = take(states, asks, now_s)
        if not decision.is_admitted or not shares:
            return decision, [0] * len(asks)
        grants = draw_shares(states, asks, shares, now_s)
        levels = [level_at(states.get(name), cap, now_s) for name, cap, _ in asks]
        return Decision(True, 0.0, asks, levels), grants

    def settle(self, key: str, name: str, capacity: int, delta: int, now_s: float) -> None:
        """Give `delta` back to one bucket, at once."""
        settle(self._buckets.setdefault(key, {}), name, capacity, delta, now_s)

    async def close(self) -> None:
        """Nothing to release."""
