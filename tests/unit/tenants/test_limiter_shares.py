"""Local shares in front of a shared limiter, on the memory reference and a fake clock:
shares follow demand and stay small, never admit beyond the bucket, go back when idle."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from conveyor.tenants.buckets import draw_shares, refill_per_s, take
from conveyor.tenants.limiter import BucketAsk, Granted, LimiterUnavailable, MemoryRateLimiter
from conveyor.tenants.limiter_shares import MAX_SHARE_DIVISOR, VIEW_TTL_S, SharedRateLimiter

pytestmark = pytest.mark.anyio

REQ = ("requests", 6400, 1)


class CountingSource(MemoryRateLimiter):
    """The memory reference as the shared store, counting the calls that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.num_calls = 0
        self.is_down = False

    async def take_shares(
        self, key: str, asks: Sequence[BucketAsk], now_s: float, shares: Sequence[int]
    ) -> Granted:
        if self.is_down:
            raise LimiterUnavailable("down")
        self.num_calls += 1
        await asyncio.sleep(0)  # a round trip: other tasks run meanwhile
        return await super().take_shares(key, asks, now_s, shares)

    async def level(self, key: str, ask: BucketAsk, now_s: float) -> int:
        decision, _ = await super().take_shares(key, [(ask[0], ask[1], 0)], now_s, ())
        return decision.views[0].remaining


def test_a_share_is_granted_whole_only_while_the_bucket_stays_half_full() -> None:
    states: dict[str, object] = {}
    specs = [("requests", 100, 1), ("input_tokens", 1000, 400)]
    assert take(states, specs, 0.0).is_admitted  # type: ignore[arg-type]
    assert draw_shares(states, specs, [3, 200], 0.0) == [3, 0]  # type: ignore[arg-type]
    assert states["requests"].level == 96  # type: ignore[attr-defined]
    assert states["input_tokens"].level == 600  # type: ignore[attr-defined]


async def test_a_busy_key_admits_locally_after_its_first_calls() -> None:
    source = CountingSource()
    shared = SharedRateLimiter(source, clock=lambda: 0.0)
    for i in range(1000):
        decision = await shared.take("k", [REQ], now_s=i * 0.001)
        assert decision.is_admitted
    assert source.num_calls < 100  # shares, renewed as they run low
    assert await source.level("k", REQ, 1.0) <= 6400 - 1000 + 1.0 * 6400 / 60


async def test_a_share_never_exceeds_its_fraction_of_the_bucket() -> None:
    source = CountingSource()
    shared = SharedRateLimiter(source, clock=lambda: 0.0)
    for _ in range(50):  # a burst: demand far above what a small bucket may share
        await shared.take("k", [("requests", 320, 1)], now_s=0.0)
    (share,) = shared._shares.values()
    assert share.allowance[0] <= 320 // MAX_SHARE_DIVISOR


async def test_concurrent_takes_never_admit_beyond_the_bucket() -> None:
    source = CountingSource()
    sharers = [SharedRateLimiter(source, clock=lambda: 0.0) for _ in range(2)]
    outcomes = await asyncio.gather(
        *(sharers[i % 2].take("k", [("requests", 100, 1)], now_s=0.0) for i in range(300))
    )
    admitted = sum(d.is_admitted for d in outcomes)
    assert 100 - 2 * 100 // MAX_SHARE_DIVISOR <= admitted <= 100
    for sharer in sharers:
        await sharer.close()
    assert await source.level("k", ("requests", 100, 1), 0.0) == 100 - admitted


async def test_near_the_limit_every_admission_goes_to_the_store() -> None:
    source = CountingSource()
    shared = SharedRateLimiter(source, clock=lambda: 0.0)
    for _ in range(60):  # past half of the bucket: no share is granted any more
        await shared.take("k", [("requests", 100, 1)], now_s=0.0)
    before = source.num_calls
    for _ in range(5):
        await shared.take("k", [("requests", 100, 1)], now_s=0.0)
    assert source.num_calls - before == 5


async def test_an_idle_share_goes_back_and_close_gives_back_the_rest() -> None:
    source = CountingSource()
    now = [0.0]
    shared = SharedRateLimiter(source, clock=lambda: now[0], idle_return_s=0.05)
    for i in range(200):
        await shared.take("idle", [REQ], now_s=i * 0.001)
    assert shared._shares["idle"].allowance[0] > 0
    now[0] = 0.3
    await asyncio.sleep(0.15)
    assert not shared._shares  # given back
    refill = int(0.3 * 6400 / 60) - 1
    assert await source.level("idle", REQ, 0.3) >= 6400 - 200 + refill
    for i in range(200):
        await shared.take("open", [REQ], now_s=0.3 + i * 0.001)
    await shared.close()
    assert await source.level("open", REQ, 0.6) >= 6400 - 200 + refill


async def test_refunds_stay_in_the_share_and_a_debt_goes_to_the_store() -> None:
    source = CountingSource()
    shared = SharedRateLimiter(source, clock=lambda: 0.0)
    out = ("output_tokens", 3200, 50)
    for _ in range(20):
        await shared.take("k", [out], now_s=0.0)
    (share,) = shared._shares.values()
    held = share.allowance[0]
    shared.settle("k", "output_tokens", 3200, 40, 0.0)  # a refund: reusable here at once
    assert share.allowance[0] == min(held + 40, 3200 // MAX_SHARE_DIVISOR)
    calls = source.num_calls
    shared.settle("k", "output_tokens", 3200, -10_000, 0.0)  # a debt beyond the share
    assert share.allowance[0] == 0 and share.is_in_debt
    refused = await shared.take("k", [("output_tokens", 3200, 0)], now_s=0.0)
    assert source.num_calls == calls + 1 and not refused.is_admitted


async def test_a_share_keeps_admitting_while_the_store_is_down_then_raises() -> None:
    source = CountingSource()
    shared = SharedRateLimiter(source, clock=lambda: 0.0)
    for i in range(300):
        await shared.take("k", [REQ], now_s=i * 0.001)
    source.is_down = True
    held = int(shared._shares["k"].allowance[0])
    assert held > 0
    for _ in range(held):
        assert (await shared.take("k", [REQ], now_s=0.3)).is_admitted
    with pytest.raises(LimiterUnavailable):
        await shared.take("k", [REQ], now_s=0.3)


async def test_headers_never_show_more_than_the_capacity() -> None:
    source = CountingSource()
    shared = SharedRateLimiter(source, clock=lambda: 0.0)
    for i in range(100):
        decision = await shared.take("k", [REQ], now_s=i * 0.001)
    later = await shared.take("k", [REQ], now_s=600.0)
    assert decision.views[0].remaining <= 6400 and later.views[0].remaining <= 6400


async def busy_share(shared: SharedRateLimiter, asks: list[BucketAsk]) -> None:
    """Enough admissions on key "k" for it to hold a share."""
    for i in range(300):
        await shared.take("k", asks, now_s=i * 0.001)
    assert shared._shares["k"].allowance[0] > 2


async def test_admissions_from_a_share_show_one_view_for_a_few_ms() -> None:
    shared = SharedRateLimiter(CountingSource(), clock=lambda: 0.0)
    await busy_share(shared, [REQ])
    first = shared.take_now("k", [REQ], 0.5)
    second = shared.take_now("k", [REQ], 0.5 + VIEW_TTL_S / 2)
    assert first is not None and second is first  # one view: its headers are built once
    later = shared.take_now("k", [REQ], 0.5 + VIEW_TTL_S)
    assert later is not None and later is not first
    gained = refill_per_s(REQ[1]) * VIEW_TTL_S  # two more admissions since, and the refill
    assert later.levels[0] == pytest.approx(first.levels[0] - 2 + gained)


async def test_a_settlement_shows_in_the_view_within_its_few_ms() -> None:
    out = ("output_tokens", 32_000, 50)
    shared = SharedRateLimiter(CountingSource(), clock=lambda: 0.0)
    await busy_share(shared, [out])
    before = shared.take_now("k", [out], 0.5)
    shared.settle("k", "output_tokens", 32_000, 30, 0.5)  # a refund into the share
    assert shared.take_now("k", [out], 0.5) is before  # settlements do not rebuild the view
    after = shared.take_now("k", [out], 0.5 + VIEW_TTL_S)
    assert before is not None and after is not None and after is not before
    gained = refill_per_s(out[1]) * VIEW_TTL_S
    assert after.levels[0] == pytest.approx(before.levels[0] + 30 - 2 * 50 + gained)
