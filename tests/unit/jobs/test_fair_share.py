"""Fair shares across tenants: the pure queue order on a fake clock, and the claims that
follow it on an in-memory store (paused tenants, e.g. over their budget, skipped)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from conveyor.jobs.claims import claim_fairly
from conveyor.jobs.context import JobsContext
from conveyor.jobs.fair_share import FairShare
from conveyor.jobs.supervisor import Supervisor
from conveyor.stores.records import BatchStatus
from conveyor.stores.tenant_records import UsageRow
from conveyor.tenants.budget import MonthlyBudgets, month_start_s
from tests.unit.jobs.fakes import Clock, create_batch, input_file, make_ctx, upload

HOUR_S = 3600.0


def test_a_tenant_that_used_nothing_goes_before_a_busy_one() -> None:
    share = FairShare()
    share.charge("a", 20_000, now_s=0.0)
    assert share.order(["a", "b"], now_s=1.0) == ["b", "a"]
    assert share.pick(["a"], now_s=1.0) == "a" and share.pick([], now_s=1.0) is None


def test_use_halves_every_half_life() -> None:
    share = FairShare(half_life_s=HOUR_S)
    share.charge("a", 1000, now_s=0.0)
    assert share.use("a", HOUR_S) == pytest.approx(500)
    assert share.use("a", 3 * HOUR_S) == pytest.approx(125)
    share.charge("a", 100, now_s=HOUR_S)
    assert share.use("a", 2 * HOUR_S) == pytest.approx(300)
    assert share.use("never", 0.0) == 0.0


def test_old_use_is_forgiven_against_recent_use() -> None:
    share = FairShare(half_life_s=60.0)
    share.charge("a", 1000, now_s=0.0)  # long ago
    share.charge("b", 100, now_s=590.0)  # just now
    assert share.order(["b", "a"], now_s=600.0) == ["a", "b"]


def test_ties_keep_the_given_order() -> None:
    share = FairShare()
    assert share.order(["c", "a", "b", "a"], now_s=0.0) == ["c", "a", "b"]


def test_claims_split_by_weight() -> None:
    """Tenant a of weight 2 gets two shards for each of b's while both wait."""
    share = FairShare(weights={"a": 2.0})
    taken: Counter[str] = Counter()
    for step in range(300):
        tenant = share.pick(["a", "b"], now_s=float(step))
        assert tenant is not None
        share.charge(tenant, 10, now_s=float(step))
        taken[tenant] += 1
    assert taken["a"] == pytest.approx(200, abs=2) and taken["b"] == pytest.approx(100, abs=2)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        FairShare(half_life_s=0)
    with pytest.raises(ValueError):
        FairShare(weights={"a": 0.0})
    with pytest.raises(ValueError):
        FairShare().charge("a", -1, now_s=0.0)


async def planned_batch(ctx: JobsContext, tenant: str, num_lines: int) -> str:
    """An in-progress batch of `tenant` with `num_lines` lines."""
    source = upload(ctx, input_file(num_lines), tenant=tenant)
    batch = create_batch(ctx, source.id, tenant=tenant)
    await Supervisor(ctx, asyncio.Event()).plan(batch)
    return batch.id


async def in_progress(ctx: JobsContext) -> list:  # type: ignore[type-arg]
    return await ctx.store.batches_in_status([BatchStatus.IN_PROGRESS])


@pytest.mark.anyio
async def test_a_later_small_job_is_claimed_before_the_rest_of_a_big_one() -> None:
    ctx = make_ctx(lines_per_shard=10)
    big = await planned_batch(ctx, "a", 200)
    first = await claim_fairly(ctx, await in_progress(ctx))
    assert first is not None and first.batch_id == big
    small = await planned_batch(ctx, "b", 20)
    claimed = [await claim_fairly(ctx, await in_progress(ctx)) for _ in range(4)]
    assert [lease.batch_id for lease in claimed if lease] == [small, big, small, big]


@pytest.mark.anyio
async def test_a_paused_tenant_is_skipped_until_it_is_resumed() -> None:
    ctx = make_ctx(lines_per_shard=10)
    paused = {"b"}

    async def is_paused(tenant: str) -> bool:
        return tenant in paused

    ctx.is_tenant_paused = is_paused
    only_b = await planned_batch(ctx, "b", 10)
    assert await claim_fairly(ctx, await in_progress(ctx)) is None
    paused.clear()
    lease = await claim_fairly(ctx, await in_progress(ctx))
    assert lease is not None and lease.batch_id == only_b


@pytest.mark.anyio
async def test_a_tenant_over_its_budget_waits_in_progress_until_it_is_raised() -> None:
    clock = Clock()
    ctx = make_ctx(lines_per_shard=10, clock=clock)
    budgets = MonthlyBudgets({"b": 1.0}, clock=clock)
    budgets.bind(ctx.store.blocking)
    ctx.is_tenant_paused = budgets.is_over
    month_s = month_start_s(clock())
    ctx.store.blocking.add_usage([UsageRow("b", "m", month_s, 1, 10, 0, 60.0, 1.0)])
    over = await planned_batch(ctx, "b", 10)
    other = await planned_batch(ctx, "a", 10)
    lease = await claim_fairly(ctx, await in_progress(ctx))
    assert lease is not None and lease.batch_id == other
    assert await claim_fairly(ctx, await in_progress(ctx)) is None
    assert {b.id for b in await in_progress(ctx)} == {over, other}
    budgets.budgets_usd["b"] = 2.0  # raised
    lease = await claim_fairly(ctx, await in_progress(ctx))
    assert lease is not None and lease.batch_id == over
