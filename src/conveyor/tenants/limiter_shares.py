"""Local shares of the Redis buckets: a busy process admits most requests without Redis.

A process that admits many requests against one tenant and model draws a *share* of each
bucket along with an admission (one script call: the admission, then the share, taken
from the shared bucket like any other tokens) and then admits from that share in memory,
renewing it in the background before it runs out. Redis still holds the truth: whatever a
process may admit by itself was first taken from the shared bucket, so all gateways
together never admit more than the limit. The cost is the other way: a share one process
holds is not available to another until it is used or given back, so shares are kept small
and only drawn while the bucket is comfortably full:

- a share covers about `SHARE_S` of the key's recent demand at this process, and never
  more than `1 / MAX_SHARE_DIVISOR` of the bucket's capacity (at rpm 100: 3 requests);
- the script grants a share only while the bucket stays at least half full after it
  (`buckets.SHARE_FLOOR`): close to a limit, every admission goes to Redis and is
  exact, as without shares;
- a share unused for `IDLE_RETURN_S` goes back to its bucket, and so does every share when
  the process closes.

Settlements (refunds, debts) go to the key's local share while it exists (a refund is
reusable at once); the part a share cannot hold goes to Redis as before. A debt sent to
Redis stops local admissions on that key until the next call to Redis has seen it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conveyor.tenants.buckets import Decision, refill_per_s
from conveyor.tenants.limiter import BucketAsk, LimiterUnavailable, ShareSource

log = logging.getLogger(__name__)

SHARE_S = 0.25  # a share covers about this long of the key's demand here
MAX_SHARE_DIVISOR = 32  # a share is at most this fraction of its bucket's capacity
MIN_DEMAND_WINDOW_S = 0.05  # demand is measured over at least this long
IDLE_RETURN_S = 1.0  # an unused share goes back after this long
VIEW_TTL_S = 0.005  # admissions from a share show the same view for at most this long


@dataclass(slots=True)
class Share:
    """What this process may admit by itself on one key, bucket by bucket (ask order).

    Every amount here is whole tokens: grants, amounts and settlement deltas all are.
    """

    names: tuple[str, ...]
    capacities: tuple[int, ...]
    allowance: list[int]
    remote_levels: list[float]  # the buckets in Redis after this process's last call
    remote_at_s: float
    targets: list[int]  # the shares last granted: renew when under half of them
    demand: list[int]  # taken here since `demand_since_s`
    demand_since_s: float
    used_at_s: float
    is_renewing: bool = False
    is_in_debt: bool = False  # a debt went to Redis: admit there until it has been seen
    is_low: bool = False  # a bucket holds under half its last grant: time to renew
    view: Decision | None = None  # what admissions from the share show, until `view_until_s`
    view_until_s: float = 0.0

    def draw(self, asks: Sequence[BucketAsk], now_s: float) -> Decision | None:
        """Take the amounts from the share if it holds every one (None: it does not).

        The decision is the share's view (what the headers show), rebuilt after each call
        to Redis and otherwise at most every `VIEW_TTL_S` (a settlement shows by then):
        admissions in between share it. Flat: most admissions run this.
        """
        allowance = self.allowance
        if self.is_in_debt or len(asks) != len(allowance):
            return None
        for ask, held in zip(asks, allowance):  # noqa: B905 (lengths checked: hot path)
            if ask[2] > held:
                return None
        demand, targets = self.demand, self.targets
        for i, ask in enumerate(asks):
            left = allowance[i] - ask[2]
            allowance[i] = left
            demand[i] += ask[2]
            if 2 * left < targets[i]:  # under half the last grant: renew in the background
                self.is_low = True
        self.used_at_s = now_s
        view = self.view
        if view is None or now_s >= self.view_until_s:
            # Its asks' amounts are this admission's; an admitted decision's readers (the
            # headers, the views) use only names, capacities and levels.
            view = self.view = Decision(True, 0.0, asks, self.levels_at(now_s))
            self.view_until_s = now_s + VIEW_TTL_S
        return view

    def levels_at(self, now_s: float) -> list[float]:
        """What the headers show: the buckets as Redis last said, refilled since, plus what
        this process still holds."""
        elapsed_s = max(0.0, now_s - self.remote_at_s)
        return [
            min(float(cap), level + elapsed_s * refill_per_s(cap) + held)
            for level, held, cap in zip(
                self.remote_levels, self.allowance, self.capacities, strict=True
            )
        ]

    def wanted(self, asks: Sequence[BucketAsk], now_s: float) -> list[int]:
        """The share to draw per bucket: about `SHARE_S` of recent demand, capped."""
        window_s = max(MIN_DEMAND_WINDOW_S, now_s - self.demand_since_s)
        return [
            min(cap // MAX_SHARE_DIVISOR, int((taken + amount) * SHARE_S / window_s))
            for (_, cap, amount), taken in zip(asks, self.demand, strict=True)
        ]

    def refresh(self, decision: Decision, grants: Sequence[int], now_s: float) -> None:
        """A call to Redis answered: its levels, the shares granted, a new demand window."""
        n = len(self.names)
        self.remote_levels = list(decision.levels)
        self.remote_at_s = now_s
        self.targets = list(grants) if grants else [0] * n
        for i, granted in enumerate(grants):
            self.allowance[i] += granted
        self.demand = [0] * n
        self.demand_since_s = now_s
        self.is_in_debt = False
        self.is_low = False
        self.view = None

    def settle(self, i: int, delta: int) -> int:
        """Put a settlement into bucket `i`'s share, up to what a share may hold; returns
        what it cannot hold (for Redis: a refund beyond that, or a debt beyond it)."""
        held = self.allowance[i] + delta
        kept = min(max(held, 0), max(1, self.capacities[i] // MAX_SHARE_DIVISOR))
        self.allowance[i] = kept
        if held < kept:
            self.is_in_debt = True
        return held - kept


def new_share(asks: Sequence[BucketAsk], now_s: float) -> Share:
    """An empty share for a key (its first call to Redis fills it in with `refresh`)."""
    n = len(asks)
    return Share(
        names=tuple(name for name, _, _ in asks),
        capacities=tuple(cap for _, cap, _ in asks),
        allowance=[0] * n,
        remote_levels=[0.0] * n,
        remote_at_s=now_s,
        targets=[0] * n,
        demand=[0] * n,
        demand_since_s=now_s,
        used_at_s=now_s,
    )


class SharedRateLimiter:
    """`RedisRateLimiter` (or any `ShareSource`) with local shares in front (see the module)."""

    def __init__(
        self,
        remote: ShareSource,
        *,
        clock: Callable[[], float] = time.time,
        idle_return_s: float = IDLE_RETURN_S,
    ) -> None:
        """Admit through `remote`; `clock` (unix seconds, the gate's) times idle shares."""
        self.remote = remote
        self._clock = clock
        self._idle_return_s = idle_return_s
        self._shares: dict[str, Share] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._renewals: set[asyncio.Task[None]] = set()

    def take_now(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision | None:
        """From the key's share when it holds every amount (None: ask Redis with `take`)."""
        share = self._shares.get(key)
        if share is None:
            return None
        decision = share.draw(asks, now_s)
        if decision is not None and share.is_low and not share.is_renewing:
            self._renew(key, share, asks, now_s)
        return decision

    async def take(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision:
        """From the key's share when it holds every amount, else from Redis (drawing a
        share along); raises LimiterUnavailable only when Redis is needed and down."""
        decision = self.take_now(key, asks, now_s)
        if decision is not None:
            return decision
        share = self._shares.get(key)
        wanted = share.wanted(asks, now_s) if share is not None and not share.is_renewing else ()
        decision, grants = await self.remote.take_shares(key, asks, now_s, wanted)
        if not decision.is_admitted:
            return decision
        share = self._shares.get(key)
        if share is None:
            share = self._shares[key] = new_share(asks, now_s)
            self._start_sweeper()
        share.refresh(decision, grants, now_s)
        share.used_at_s = now_s
        return Decision(True, 0.0, asks, share.levels_at(now_s))

    def _renew(self, key: str, share: Share, asks: Sequence[BucketAsk], now_s: float) -> None:
        """Draw the next share in the background (nothing is admitted by it)."""
        share.is_renewing = True
        nothing = [(name, cap, 0) for name, cap, _ in asks]
        renewal = self._renewal(key, share, nothing, share.wanted(nothing, now_s), now_s)
        task = asyncio.get_running_loop().create_task(renewal)
        self._renewals.add(task)
        task.add_done_callback(self._renewals.discard)

    async def _renewal(
        self, key: str, share: Share, nothing: Sequence[BucketAsk], wanted: list[int], now_s: float
    ) -> None:
        try:
            decision, grants = await self.remote.take_shares(key, nothing, now_s, wanted)
        except LimiterUnavailable:
            log.debug("rate limit share renewal failed; admissions go to Redis")
            return
        finally:
            share.is_renewing = False
        if self._shares.get(key) is share:
            share.refresh(decision, grants, now_s)
        else:  # given back meanwhile: so is this
            self._give_back(key, share, grants, now_s)

    def settle(self, key: str, name: str, capacity: int, delta: int, now_s: float) -> None:
        """Into the key's share while it exists (a refund is reusable here at once); what
        the share cannot hold, or every delta without a share, goes to Redis."""
        share = self._shares.get(key)
        if share is not None and name in share.names:
            delta = share.settle(share.names.index(name), delta)
        if delta != 0:
            self.remote.settle(key, name, capacity, delta, now_s)

    def _start_sweeper(self) -> None:
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self._idle_return_s, self._sweep)

    def _sweep(self) -> None:
        """Give back the shares unused for a while; look again while any is left."""
        self._sweeper = None
        now_s = self._clock()
        for key, share in list(self._shares.items()):
            if now_s - share.used_at_s >= self._idle_return_s and not share.is_renewing:
                del self._shares[key]
                self._give_back(key, share, share.allowance, now_s)
        if self._shares:
            self._start_sweeper()

    def _give_back(self, key: str, share: Share, amounts: Sequence[int], now_s: float) -> None:
        """Return `amounts` (per bucket of `share`) to Redis."""
        for name, cap, amount in zip(share.names, share.capacities, amounts, strict=True):
            if amount > 0:
                self.remote.settle(key, name, cap, amount, now_s)

    async def close(self) -> None:
        """Give every share back, then send what is queued and close Redis."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._renewals:
            await asyncio.gather(*self._renewals, return_exceptions=True)
        now_s = self._clock()
        for key, share in self._shares.items():
            self._give_back(key, share, share.allowance, now_s)
        self._shares.clear()
        await self.remote.close()
