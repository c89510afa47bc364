"""The bucket backends keep one contract: memory and real Redis (Lua) on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis

from conveyor.tenants.limiter import LimiterUnavailable, MemoryRateLimiter, RateLimiter
from conveyor.tenants.limiter_redis import BatchOp, RedisRateLimiter
from conveyor.tenants.limiter_shares import MAX_SHARE_DIVISOR, SharedRateLimiter
from tests.redis_server import REDIS_HOST, REDIS_PORT, REDIS_URL
from tests.tcp_proxy import ProxyMode, TcpProxy

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    if request.param == "memory":
        yield MemoryRateLimiter()
        return
    prefix = request.getfixturevalue("redis_prefix")
    backend = RedisRateLimiter(REDIS_URL, prefix=prefix, timeout_s=1.0)
    yield backend
    await backend.close()


async def test_takes_refill_and_refusals_match_the_reference(limiter: RateLimiter) -> None:
    asks = [("requests", 60, 1), ("input_tokens", 600, 500)]
    ok = await limiter.take("t\x1fm", asks, 1000.0)
    assert ok.is_admitted and [v.remaining for v in ok.views] == [59, 100]
    refused = await limiter.take(
        "t\x1fm", [("requests", 60, 1), ("input_tokens", 600, 400)], 1000.0
    )
    assert not refused.is_admitted and refused.refused_by == "input_tokens"
    assert refused.retry_after_s == pytest.approx(30)
    assert [v.remaining for v in refused.views] == [59, 100]  # nothing taken
    later = await limiter.take("t\x1fm", [("requests", 60, 1), ("input_tokens", 600, 400)], 1030.0)
    assert later.is_admitted and [v.remaining for v in later.views] == [59, 0]  # rpm refilled


async def test_settlement_refunds_and_debts(limiter: RateLimiter) -> None:
    await limiter.take("k", [("output_tokens", 100, 80)], 0.0)
    limiter.settle("k", "output_tokens", 100, 50, 0.0)
    after = await limiter.take("k", [("output_tokens", 100, 0)], 0.0)
    assert [v.remaining for v in after.views] == [70]
    limiter.settle("k", "output_tokens", 100, -120, 0.0)
    refused = await limiter.take("k", [("output_tokens", 100, 0)], 0.0)
    assert not refused.is_admitted and refused.retry_after_s == pytest.approx(30)


async def test_keys_and_tenants_are_separate(limiter: RateLimiter) -> None:
    assert (await limiter.take("a", [("requests", 1, 1)], 0.0)).is_admitted
    assert (await limiter.take("b", [("requests", 1, 1)], 0.0)).is_admitted
    assert not (await limiter.take("a", [("requests", 1, 1)], 0.0)).is_admitted


async def test_concurrent_takes_on_redis_admit_exactly_the_capacity(redis_prefix: str) -> None:
    limiters = [RedisRateLimiter(REDIS_URL, prefix=redis_prefix, timeout_s=2.0) for _ in range(2)]
    try:
        outcomes = await asyncio.gather(
            *(limiters[i % 2].take("k", [("requests", 100, 1)], 0.0) for i in range(300))
        )
    finally:
        for backend in limiters:
            await backend.close()
    assert sum(d.is_admitted for d in outcomes) == 100


async def test_redis_keys_expire_once_they_would_be_full(redis_prefix: str) -> None:
    backend = RedisRateLimiter(REDIS_URL, prefix=redis_prefix, timeout_s=1.0)
    try:
        await backend.take("k", [("requests", 60, 6)], 0.0)
    finally:
        await backend.close()
    client = redis.Redis.from_url(REDIS_URL)
    ttl_ms = client.pttl(f"{redis_prefix}k:requests")
    client.close()
    assert 6_000 < ttl_ms <= 7_000  # 6 s to refill, plus a second


async def test_an_unreachable_redis_raises_and_recovers(redis_prefix: str) -> None:
    with TcpProxy(REDIS_HOST, REDIS_PORT) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        backend = RedisRateLimiter(url, prefix=redis_prefix, timeout_s=0.2)
        try:
            assert (await backend.take("k", [("requests", 10, 1)], 0.0)).is_admitted
            for mode in (ProxyMode.REFUSE, ProxyMode.FREEZE):
                proxy.set_mode(mode)
                with pytest.raises(LimiterUnavailable):
                    await backend.take("k", [("requests", 10, 1)], 0.0)
                proxy.set_mode(ProxyMode.PASS)
                decision = await backend.take("k", [("requests", 10, 1)], 0.0)
                assert decision.is_admitted
        finally:
            await backend.close()


class CountingLimiter(RedisRateLimiter):
    """Counts the script calls (batches) it makes."""

    num_calls = 0

    async def _send(self, batch: list[BatchOp]) -> None:
        self.num_calls += 1
        await super()._send(batch)


async def test_concurrent_admissions_share_round_trips(redis_prefix: str) -> None:
    backend = CountingLimiter(REDIS_URL, prefix=redis_prefix, timeout_s=2.0)
    try:
        outcomes = await asyncio.gather(
            *(backend.take(f"k{i % 3}", [("requests", 10, 1)], 0.0) for i in range(60))
        )
    finally:
        await backend.close()
    assert sum(d.is_admitted for d in outcomes) == 30  # 10 per key, each in order
    assert backend.num_calls < 10  # the first alone, the rest together


async def test_a_settlement_goes_soon_without_an_admission_and_on_close(
    redis_prefix: str,
) -> None:
    first = RedisRateLimiter(REDIS_URL, prefix=redis_prefix, timeout_s=1.0, settle_delay_s=0.05)
    second = RedisRateLimiter(REDIS_URL, prefix=redis_prefix, timeout_s=1.0)
    try:
        await first.take("k", [("output_tokens", 100, 80)], 0.0)
        first.settle("k", "output_tokens", 100, 50, 0.0)
        await asyncio.sleep(0.3)  # no admission on `first`: the delay sends it
        seen = await second.take("k", [("output_tokens", 100, 0)], 0.0)
        assert [v.remaining for v in seen.views] == [70]
        first.settle("k", "output_tokens", 100, 20, 0.0)
    finally:
        await first.close()  # sends the queued settlement
    try:
        seen = await second.take("k", [("output_tokens", 100, 0)], 0.0)
        assert [v.remaining for v in seen.views] == [90]
    finally:
        await second.close()


async def test_settlements_a_down_redis_loses_are_counted(redis_prefix: str) -> None:
    lost: list[int] = []
    with TcpProxy(REDIS_HOST, REDIS_PORT) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        backend = RedisRateLimiter(
            url, prefix=redis_prefix, timeout_s=0.2, on_lost_settlements=lost.append
        )
        try:
            assert (await backend.take("k", [("requests", 10, 1)], 0.0)).is_admitted
            proxy.set_mode(ProxyMode.REFUSE)
            backend.settle("k", "requests", 10, 1, 0.0)
            with pytest.raises(LimiterUnavailable):  # sent together with the settlement
                await backend.take("k", [("requests", 10, 1)], 0.0)
            proxy.set_mode(ProxyMode.PASS)
            assert (await backend.take("k", [("requests", 10, 1)], 0.0)).is_admitted
        finally:
            await backend.close()
    assert lost == [1]


async def test_shares_from_redis_match_the_memory_reference(redis_prefix: str) -> None:
    backend = RedisRateLimiter(REDIS_URL, prefix=redis_prefix, timeout_s=1.0)
    reference = MemoryRateLimiter()
    asks = [("requests", 100, 1), ("input_tokens", 1000, 300)]
    try:
        for shares in ([3, 100], [40, 0], [3, 300]):
            got = await backend.take_shares("k", asks, 0.0, shares)
            want = await reference.take_shares("k", asks, 0.0, shares)
            assert got[1] == want[1]
            assert [v.remaining for v in got[0].views] == [v.remaining for v in want[0].views]
    finally:
        await backend.close()


async def test_shared_limiters_on_redis_never_admit_beyond_the_rpm(redis_prefix: str) -> None:
    limiters = [
        SharedRateLimiter(RedisRateLimiter(REDIS_URL, prefix=redis_prefix, timeout_s=2.0))
        for _ in range(2)
    ]
    outcomes = await asyncio.gather(
        *(limiters[i % 2].take("k", [("requests", 100, 1)], 0.0) for i in range(300))
    )
    for backend in limiters:
        await backend.close()  # gives back what shares are left
    admitted = sum(d.is_admitted for d in outcomes)
    assert 100 - 2 * 100 // MAX_SHARE_DIVISOR <= admitted <= 100
    client = redis.Redis.from_url(REDIS_URL)
    level = float(client.hget(f"{redis_prefix}k:requests", "l") or 0)
    client.close()
    assert level == 100 - admitted  # every share not used went back
