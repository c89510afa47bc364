"""Monthly budgets: whether a tenant's cost this calendar month (UTC) reached `budget_usd`.

The month's cost is the usage ledger's `cost_usd` summed from the month's first second. It is
read from the job store at most once every `refresh_s` per tenant and cached in between, so
the check costs a dictionary lookup on nearly every request. A store that cannot be read
keeps the last known cost (or none: a tenant is not refused because the store is down).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from conveyor.errors import InsufficientQuota
from conveyor.stores.errors import StoreError
from conveyor.stores.protocols import UsageStore

log = logging.getLogger(__name__)

REFRESH_S = 5.0


def month_start_s(now_s: float) -> int:
    """The first second (unix time) of the UTC calendar month holding `now_s`."""
    now = datetime.fromtimestamp(now_s, UTC)
    return int(datetime(now.year, now.month, 1, tzinfo=UTC).timestamp())


@dataclass(frozen=True, slots=True)
class _Cost:
    """A tenant's cost since `month_s`, read at `read_at_s`."""

    cost_usd: float
    month_s: int
    read_at_s: float


class MonthlyBudgets:
    """Each budgeted tenant's month's cost, cached; answers whether the budget is spent."""

    def __init__(
        self,
        budgets_usd: Mapping[str, float],
        *,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`budgets_usd` by tenant; tenants not in it have no budget. No store until `bind`."""
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
        self.budgets_usd = dict(budgets_usd)
        self.refresh_s = refresh_s
        self._clock = clock
        self._store: UsageStore | None = None
        self._costs: dict[str, _Cost] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Requests refused for a spent budget since start, by tenant (the dashboard shows it).
        self.num_refused: dict[str, int] = {}

    @property
    def has_budgets(self) -> bool:
        """Whether any tenant has a budget (else every check is a no-op)."""
        return bool(self.budgets_usd)

    def bind(self, store: UsageStore | None) -> None:
        """Read costs from `store` from now on (None: stop reading; forget cached costs)."""
        self._store = store
        self._costs.clear()

    async def is_over(self, tenant: str) -> bool:
        """Whether the tenant's month's cost reached its budget."""
        budget_usd = self.budgets_usd.get(tenant)
        if budget_usd is None:
            return False
        cost_usd = await self.month_cost_usd(tenant)
        return cost_usd is not None and cost_usd >= budget_usd

    async def check(self, tenant: str) -> None:
        """Raise `InsufficientQuota` (429) when the tenant's monthly budget is spent."""
        if await self.is_over(tenant):
            self.num_refused[tenant] = self.num_refused.get(tenant, 0) + 1
            raise InsufficientQuota(
                f"tenant {tenant!r} has spent its monthly budget of "
                f"${self.budgets_usd[tenant]:g}; ask an administrator to raise it"
            )

    def known_cost_usd(self, tenant: str) -> float | None:
        """The tenant's cost this month as last read (None: not read yet); reads nothing."""
        entry = self._costs.get(tenant)
        if entry is None or entry.month_s != month_start_s(self._clock()):
            return None
        return entry.cost_usd

    async def month_cost_usd(self, tenant: str) -> float | None:
        """The tenant's cost this month: cached when fresh, else read (None: unknown)."""
        now_s = self._clock()
        cached = self._fresh(tenant, now_s)
        if cached is not None or self._store is None:
            return cached
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            cached = self._fresh(tenant, now_s)  # another caller may have just read it
            return cached if cached is not None else await self._read(tenant, now_s)

    def _fresh(self, tenant: str, now_s: float) -> float | None:
        """The cached cost when read less than `refresh_s` ago in this month."""
        entry = self._costs.get(tenant)
        if entry is None or entry.month_s != month_start_s(now_s):
            return None
        return entry.cost_usd if now_s - entry.read_at_s < self.refresh_s else None

    async def _read(self, tenant: str, now_s: float) -> float | None:
        """Sum the ledger's cost since the month's start; keep the old value on store errors."""
        store = self._store
        if store is None:
            return None
        month_s = month_start_s(now_s)
        try:
            rows = await asyncio.to_thread(store.list_usage, month_s, None, tenant)
        except StoreError as exc:
            log.warning("cannot read %s's usage for its budget: %s", tenant, exc)
            entry = self._costs.get(tenant)
            return entry.cost_usd if entry is not None and entry.month_s == month_s else None
        cost_usd = sum(row.cost_usd for row in rows)
        self._costs[tenant] = _Cost(cost_usd, month_s, now_s)
        return cost_usd
