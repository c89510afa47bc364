"""Token buckets in Redis, shared by every gateway: one Lua script per admission and settlement.

Each bucket is a hash `{l: level, t: updated_at_s}` under `<prefix><key>:<name>`, expiring
once it would have refilled (an absent bucket is full), so idle tenants leave nothing behind.
The scripts mirror `tenants.buckets`; callers pass the clock, which keeps them testable and
gateways on one host agree on it. Every call is bounded by `timeout_s`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from conveyor.tenants.buckets import Decision, view
from conveyor.tenants.limiter import BucketAsk, LimiterUnavailable

MAX_CONNECTIONS = 64
POOL_WAIT_S = 1.0

# Shared by both scripts: a bucket's level now (full when absent).
_LEVEL_AT = """
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
"""

# KEYS: buckets; ARGV: now, then capacity and amount per bucket.
# Returns {refused bucket index (0: admitted), wait_s, level per bucket}.
TAKE_LUA = (
    _LEVEL_AT
    + """
local now = tonumber(ARGV[1])
local levels, wait, refused = {}, 0, 0
for i = 1, #KEYS do
  local cap, amount = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  levels[i] = level_at(KEYS[i], cap, now)
  local w = (amount - levels[i]) / (cap / 60.0)
  if w > wait then wait, refused = w, i end
end
if refused == 0 then
  for i = 1, #KEYS do
    local cap, amount = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    levels[i] = levels[i] - amount
    store(KEYS[i], levels[i], cap, now)
  end
end
local out = {refused, tostring(wait)}
for i = 1, #KEYS do out[#out + 1] = tostring(levels[i]) end
return out
"""
)

# KEYS: the bucket; ARGV: now, capacity, delta.
SETTLE_LUA = (
    _LEVEL_AT
    + """
local now, cap, delta = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
store(KEYS[1], math.min(cap, level_at(KEYS[1], cap, now) + delta), cap, now)
return 1
"""
)


class RedisRateLimiter:
    """Buckets in Redis; every gateway pointing at the same prefix shares them."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        timeout_s: float,
        max_connections: int = MAX_CONNECTIONS,
        pool_wait_s: float = POOL_WAIT_S,
    ) -> None:
        """Connect lazily to `url`; a call fails after `timeout_s` of network silence.

        A burst beyond `max_connections` waits up to `pool_wait_s` for a connection.
        """
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_wait_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        self._redis = aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
        self._prefix = prefix
        self._bound_s = 2 * timeout_s + pool_wait_s
        self._take = self._redis.register_script(TAKE_LUA)
        self._settle = self._redis.register_script(SETTLE_LUA)

    def _key(self, key: str, name: str) -> str:
        return f"{self._prefix}{key}:{name}"

    async def _run(self, script: Any, keys: list[str], args: list[object]) -> Any:
        """Run a script, turning every failure to reach Redis into LimiterUnavailable."""
        try:
            return await asyncio.wait_for(script(keys=keys, args=args), self._bound_s)
        except (RedisError, OSError, TimeoutError) as exc:
            raise LimiterUnavailable(f"rate limit backend: {exc!r}") from exc

    async def take(self, key: str, asks: Sequence[BucketAsk], now_s: float) -> Decision:
        """Take every amount or none, atomically across the buckets."""
        keys = [self._key(key, name) for name, _, _ in asks]
        args: list[object] = [repr(now_s)]
        for _, capacity, amount in asks:
            args += [capacity, amount]
        refused, wait_s, *levels = await self._run(self._take, keys, args)
        views = tuple(
            view(name, float(level), capacity)
            for (name, capacity, _), level in zip(asks, levels, strict=True)
        )
        refused_by = asks[int(refused) - 1][0] if int(refused) else None
        return Decision(refused_by is None, float(wait_s), views, refused_by)

    async def settle(self, key: str, name: str, capacity: int, delta: int, now_s: float) -> None:
        """Give `delta` back to one bucket."""
        await self._run(self._settle, [self._key(key, name)], [repr(now_s), capacity, delta])

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
