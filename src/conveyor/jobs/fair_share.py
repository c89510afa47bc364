"""Fair shares of batch capacity: weighted fair queueing across tenants with decaying use.

Each tenant's recent use (batch lines taken) decays exponentially with a half-life, so a
tenant that ran a huge job an hour ago is not punished forever, and one that never ran has
used nothing. The next shard goes to the waiting tenant with the least use per unit of
weight: a small job of tenant B arriving behind a large job of tenant A is served at once
and then shares capacity with A by weight, instead of waiting for A's job to end.

Pure logic: the caller passes the time, so tests run on a fake clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_HALF_LIFE_S = 3600.0


@dataclass(slots=True)
class _Use:
    """A tenant's decayed use as of `at_s`."""

    amount: float
    at_s: float


class FairShare:
    """Chooses which tenant's work runs next; remembers what each tenant used."""

    def __init__(
        self,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        weights: Mapping[str, float] | None = None,
        default_weight: float = 1.0,
    ) -> None:
        """`weights` by tenant name; a tenant not listed weighs `default_weight`."""
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        if default_weight <= 0 or any(w <= 0 for w in (weights or {}).values()):
            raise ValueError("tenant weights must be > 0")
        self.half_life_s = float(half_life_s)
        self._weights = dict(weights or {})
        self._default_weight = float(default_weight)
        self._uses: dict[str, _Use] = {}

    def weight(self, tenant: str) -> float:
        """The tenant's share weight."""
        return self._weights.get(tenant, self._default_weight)

    def use(self, tenant: str, now_s: float) -> float:
        """The tenant's use decayed to `now_s` (0 for a tenant never charged)."""
        entry = self._uses.get(tenant)
        if entry is None:
            return 0.0
        elapsed_s = max(0.0, now_s - entry.at_s)
        return entry.amount * math.pow(0.5, elapsed_s / self.half_life_s)

    def charge(self, tenant: str, amount: float, now_s: float) -> None:
        """Add `amount` (e.g. lines claimed) to the tenant's use at `now_s`."""
        if amount < 0:
            raise ValueError(f"amount must be >= 0, got {amount}")
        self._uses[tenant] = _Use(self.use(tenant, now_s) + amount, now_s)

    def order(self, tenants: Iterable[str], now_s: float) -> list[str]:
        """The tenants, least use per weight first; ties keep the given order (oldest work)."""
        unique = list(dict.fromkeys(tenants))
        return sorted(unique, key=lambda t: self.use(t, now_s) / self.weight(t))

    def pick(self, tenants: Iterable[str], now_s: float) -> str | None:
        """The tenant whose work should run next, or None when none waits."""
        ranked = self.order(tenants, now_s)
        return ranked[0] if ranked else None
