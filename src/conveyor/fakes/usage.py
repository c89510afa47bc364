"""The in-memory usage ledger: the `UsageStore` contract in a dictionary."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.fakes.shards import MemoryBase, op
from conveyor.stores.tenant_records import UsageRow


class MemoryUsage(MemoryBase):
    """Usage rows by (tenant, model, minute)."""

    @op
    def add_usage(self, rows: Sequence[UsageRow]) -> None:
        """Add each row to its key's row."""
        self._fold_usage(rows)

    @op
    def list_usage(
        self, start_s: int, end_s: int | None = None, tenant: str | None = None
    ) -> list[UsageRow]:
        """Rows in `[start_s, end_s)` (of `tenant`, or all), oldest minute first."""
        rows = [
            row
            for row in self._usage.values()
            if row.minute_start >= start_s
            and (end_s is None or row.minute_start < end_s)
            and (tenant is None or row.tenant == tenant)
        ]
        return sorted(rows, key=lambda r: (r.minute_start, r.tenant, r.model))
