"""Monthly budgets on a fake clock over the in-memory store: the month's boundary, the
cached cost and its refresh, and store errors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from conveyor.errors import InsufficientQuota
from conveyor.fakes.job_store import MemoryJobStore
from conveyor.stores.errors import StoreError
from conveyor.stores.tenant_records import UsageRow
from conveyor.tenants.budget import MonthlyBudgets, month_start_s

pytestmark = pytest.mark.anyio

MARCH_S = int(datetime(2026, 3, 1, tzinfo=UTC).timestamp())
APRIL_S = int(datetime(2026, 4, 1, tzinfo=UTC).timestamp())


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def spend(store: MemoryJobStore, tenant: str, minute_s: int, cost_usd: float) -> None:
    store.add_usage([UsageRow(tenant, "m", minute_s, 1, 10, 10, 1.0, cost_usd)])


def test_month_start_is_the_first_utc_second_of_the_month() -> None:
    assert month_start_s(MARCH_S) == MARCH_S
    assert month_start_s(APRIL_S - 1) == MARCH_S
    assert month_start_s(APRIL_S + 86_400 * 10) == APRIL_S


async def test_a_tenant_is_over_once_this_months_cost_reaches_its_budget() -> None:
    store, clock = MemoryJobStore(), Clock(MARCH_S + 3600)
    spend(store, "a", MARCH_S - 60, 500.0)  # last month: does not count
    spend(store, "a", MARCH_S, 60.0)
    budgets = MonthlyBudgets({"a": 100.0}, refresh_s=5.0, clock=clock)
    budgets.bind(store)
    assert not await budgets.is_over("a") and not await budgets.is_over("unbudgeted")
    spend(store, "a", MARCH_S + 60, 40.0)
    assert not await budgets.is_over("a")  # cached for refresh_s
    clock.now_s += 5.0
    assert await budgets.is_over("a")
    with pytest.raises(InsufficientQuota) as caught:
        await budgets.check("a")
    assert caught.value.status_code == 429 and caught.value.to_body()["error"]["code"] == (
        "insufficient_quota"
    )


async def test_a_new_month_starts_from_zero() -> None:
    store, clock = MemoryJobStore(), Clock(APRIL_S - 10)
    spend(store, "a", APRIL_S - 60, 100.0)
    budgets = MonthlyBudgets({"a": 100.0}, clock=clock)
    budgets.bind(store)
    assert await budgets.is_over("a")
    clock.now_s = APRIL_S + 1  # the cached March cost is not this month's
    assert not await budgets.is_over("a")


class FailingStore(MemoryJobStore):
    def __init__(self) -> None:
        super().__init__()
        self.is_down = False

    def list_usage(
        self, start_s: int, end_s: int | None = None, tenant: str | None = None
    ) -> list[UsageRow]:
        if self.is_down:
            raise StoreError("down")
        return super().list_usage(start_s, end_s, tenant)


async def test_an_unreadable_store_keeps_the_last_known_cost() -> None:
    store, clock = FailingStore(), Clock(MARCH_S)
    budgets = MonthlyBudgets({"a": 10.0, "b": 10.0}, refresh_s=1.0, clock=clock)
    budgets.bind(store)
    spend(store, "a", MARCH_S, 10.0)
    assert await budgets.is_over("a")
    store.is_down = True
    clock.now_s += 2.0
    assert await budgets.is_over("a")  # last known: spent
    assert not await budgets.is_over("b")  # never read: not refused for an outage


async def test_without_a_store_nobody_is_over() -> None:
    budgets = MonthlyBudgets({"a": 0.0})
    assert budgets.has_budgets and not await budgets.is_over("a")
    with pytest.raises(ValueError):
        MonthlyBudgets({}, refresh_s=0)
