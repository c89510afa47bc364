"""Token buckets in Redis, shared by every gateway, with one round trip for many requests.

Each bucket is a hash `{l: level, t: updated_at_s}` under `<prefix><key>:<name>`, expiring
once it would have refilled (an absent bucket is full), so idle tenants leave nothing behind.

Admissions and settlements are queued and sent together (group commit): while one call is
on its way, the admissions and settlements that arrive meanwhile wait and then go in the
next call, so a busy process makes one round trip for many requests, and an idle one still
sends an admission at once. One Lua script runs the whole batch in order; each admission in
it is atomic (every bucket or none) and sees every settlement queued before it. A
settlement never waits: it rides with the next admission, or is sent `settle_delay_s` later.

The script mirrors `tenants.buckets`; callers pass the clock, which keeps it testable and
gateways on one host agree on it. Every call is bounded by `timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from conveyor.tenants.buckets import SHARE_FLOOR, Decision
from conveyor.tenants.limiter import BucketAsk, Granted, LimiterUnavailable

log = logging.getLogger(__name__)

MAX_BATCH = 256  # requests per script call
SETTLE_DELAY_S = 0.05  # a settlement waits at most this long for an admission to ride with

# ARGV, per request in order: kind ('t' take, 's' settle), now, number of buckets n, then
# per bucket capacity, amount and share (take) or capacity, delta and 0 (settle); KEYS: the
# requests' buckets. A take that is admitted also draws each bucket's share as
# `buckets.draw_shares` does (the script mirrors it).
# Returns, per take: refused bucket index (0: admitted), wait_s, level per bucket, share
# granted per bucket.
BATCH_LUA = """
local function level_at(key, cap, now)
  local st = redis.call('HMGET', key, 'l', 't')
  if not st[1] then return cap end
  local elapsed = math.max(0, now - tonumber(st[2]))
  return math.min(cap, tonumber(st[1]) + elapsed * cap / 60.0)
end
local function store(key, level, cap, now)
  redis.call('HSET', key, 'l', tostring(level), 't', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((cap - level) / (cap / 60.0) * 1000) + 1000)
end
local out, k, a = {}, 1, 1
while a <= #ARGV do
  local kind, now, n = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  if kind == 's' then
    local cap, delta = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    store(KEYS[k], math.min(cap, level_at(KEYS[k], cap, now) + delta), cap, now)
  else
    local levels, grants, wait, refused = {}, {}, 0, 0
    for i = 1, n do
      local cap, amount = tonumber(ARGV[a + 3 * i - 3]), tonumber(ARGV[a + 3 * i - 2])
      levels[i] = level_at(KEYS[k + i - 1], cap, now)
      grants[i] = 0
      local w = (amount - levels[i]) / (cap / 60.0)
      if w > wait then wait, refused = w, i end
    end
    if refused == 0 then
      for i = 1, n do
        local cap, amount = tonumber(ARGV[a + 3 * i - 3]), tonumber(ARGV[a + 3 * i - 2])
        local share = tonumber(ARGV[a + 3 * i - 1])
        levels[i] = levels[i] - amount
        if share > 0 and levels[i] - share >= cap * FLOOR then
          grants[i] = share
          levels[i] = levels[i] - share
        end
        store(KEYS[k + i - 1], levels[i], cap, now)
      end
    end
    out[#out + 1] = refused
    out[#out + 1] = tostring(wait)
    for i = 1, n do out[#out + 1] = tostring(levels[i]) end
    for i = 1, n do out[#out + 1] = grants[i] end
  end
  k, a = k + n, a + 3 * n
end
return out
""".replace("FLOOR", repr(SHARE_FLOOR))


@dataclass(slots=True)
class BatchOp:
    """One queued admission (with the future its caller waits on) or settlement."""

    keys: list[str]
    args: list[str | int]
    asks: Sequence[BucketAsk] | None = None  # None: a settlement
    future: asyncio.Future[Granted] | None = None

    @property
    def is_abandoned(self) -> bool:
        """An admission whose caller stopped waiting (timed out or cancelled)."""
        return self.future is not None and self.future.done()


def take_op(
    keys: list[str], asks: Sequence[BucketAsk], now_s: float, shares: Sequence[int] = ()
) -> BatchOp:
    """An admission's part of a batch, drawing `shares` too if given (its future is
    attached by the caller)."""
    args: list[str | int] = ["t", repr(now_s), len(asks)]
    for i, (_, capacity, amount) in enumerate(asks):
        args += [capacity, amount, shares[i] if shares else 0]
    return BatchOp(keys, args, asks)


def settle_op(key: str, capacity: int, delta: int, now_s: float) -> BatchOp:
    """A settlement's part of a batch."""
    return BatchOp([key], ["s", repr(now_s), 1, capacity, delta, 0])


def encode(batch: Sequence[BatchOp]) -> tuple[list[str], list[str | int]]:
    """The script's KEYS and ARGV for a batch, in order."""
    keys: list[str] = []
    args: list[str | int] = []
    for op in batch:
        keys += op.keys
        args += op.args
    return keys, args


def decode(batch: Sequence[BatchOp], reply: Sequence[Any]) -> list[Granted]:
    """Each admission's decision and granted shares, in batch order, from the flat reply."""
    answers: list[Granted] = []
    at = 0
    for op in batch:
        if op.asks is None:
            continue
        n = len(op.asks)
        refused, wait_s = int(reply[at]), float(reply[at + 1])
        levels = [float(level) for level in reply[at + 2 : at + 2 + n]]
        grants = [int(g) for g in reply[at + 2 + n : at + 2 + 2 * n]]
        if len(levels) != n or len(grants) != n:
            raise ValueError("the rate limit script's reply is short")
        at += 2 + 2 * n
        refused_by = op.asks[refused - 1][0] if refused else None
        answers.append((Decision(refused_by is None, wait_s, op.asks, levels, refused_by), grants))
    return answers


class RedisRateLimiter:
    """Buckets in Redis; every gateway pointing at the same prefix shares them."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        timeout_s: float,
        settle_delay_s: float = SETTLE_DELAY_S,
        on_lost_settlements: Callable[[int], None] | None = None,
    ) -> None:
        """Connect lazily to `url`; a call fails after `timeout_s` of network silence.

        `on_lost_settlements(n)` hears of settlements a failed call could not deliver.
        """
        pool = aioredis.ConnectionPool.from_url(
            url, max_connections=2, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._redis = aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
        self._script = self._redis.register_script(BATCH_LUA)
        self._prefix = prefix
        self._call_bound_s = 2 * timeout_s  # connecting, then the answer
        self._settle_delay_s = settle_delay_s
        self._on_lost = on_lost_settlements
        self._queue: list[BatchOp] = []
        self._sender: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def _key(self, key: str, name: str) -> str:
        return f"{self._prefix}{key}:{name}"

    def take_now(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision | None:
        """Never at once: every admission asks Redis."""
        return None

    async def take(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision:
        """Take every amount or none, atomically across the buckets.

        Waits for the call on its way (if any) and its own: at most twice a call's bound.
        """
        decision, _ = await self.take_shares(key, asks, now_s, ())
        return decision

    async def take_shares(
        self, key: str, asks: Sequence[BucketAsk], now_s: float, shares: Sequence[int]
    ) -> Granted:
        """As `take`, and if admitted also draw up to `shares` (per bucket) for the caller
        to admit locally: each is granted whole while its bucket stays half full, else 0."""
        op = take_op([self._key(key, name) for name, _, _ in asks], asks, now_s, shares)
        future: asyncio.Future[Granted] = asyncio.get_running_loop().create_future()
        op.future = future
        self._queue.append(op)
        self._start_sender()
        try:
            async with asyncio.timeout(2 * self._call_bound_s):
                return await future
        except TimeoutError:
            raise LimiterUnavailable("rate limit backend: no answer in time") from None

    def settle(self, key: str, name: str, capacity: int, delta: int, now_s: float) -> None:
        """Queue `delta` for one bucket; it goes with the next call (never waited for)."""
        self._queue.append(settle_op(self._key(key, name), capacity, delta, now_s))
        if self._is_sending or self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # off the event loop: it goes with the next admission
            return
        self._timer = loop.call_later(self._settle_delay_s, self._on_timer)

    @property
    def _is_sending(self) -> bool:
        return self._sender is not None and not self._sender.done()

    def _on_timer(self) -> None:
        self._timer = None
        if self._queue:
            self._start_sender()

    def _start_sender(self) -> None:
        """Send the queue now unless a call is on its way (which sends it next)."""
        if not self._is_sending:
            self._sender = asyncio.get_running_loop().create_task(self._send_all())

    async def _send_all(self) -> None:
        """Send batches until the queue is empty (one call at a time)."""
        while self._queue:
            batch = [op for op in self._queue[:MAX_BATCH] if not op.is_abandoned]
            del self._queue[:MAX_BATCH]
            if batch:
                await self._send(batch)

    async def _send(self, batch: list[BatchOp]) -> None:
        """One script call for `batch`; its admissions hear their decision or the failure."""
        keys, args = encode(batch)
        try:
            async with asyncio.timeout(self._call_bound_s):
                reply = await self._script(keys=keys, args=args)
            answers = decode(batch, reply)
        except (RedisError, OSError, TimeoutError, ValueError, IndexError) as exc:
            self._fail(batch, exc)
            return
        takes = [op for op in batch if op.asks is not None]
        for op, answer in zip(takes, answers, strict=True):
            if op.future is not None and not op.future.done():
                op.future.set_result(answer)

    def _fail(self, batch: list[BatchOp], exc: BaseException) -> None:
        """Every admission of a failed call raises LimiterUnavailable; settlements are lost."""
        error = LimiterUnavailable(f"rate limit backend: {exc!r}")
        for op in batch:
            if op.future is not None and not op.future.done():
                op.future.set_exception(error)
        num_lost = sum(op.asks is None for op in batch)
        if num_lost:
            log.warning("rate limit backend unreachable; %d settlements lost", num_lost)
            if self._on_lost is not None:
                self._on_lost(num_lost)

    async def close(self) -> None:
        """Send what is queued (settlements included), then close the connection pool."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._sender is not None:
            await asyncio.gather(self._sender, return_exceptions=True)
        await self._send_all()
        await self._redis.aclose()
