"""Usage arithmetic, the usage page's buckets, and the online ledger's flushes."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from conveyor.errors import InvalidRequest
from conveyor.stores import StoreError
from conveyor.stores.tenant_records import UsageRow
from conveyor.tenants.ledger import UsageLedger
from conveyor.tenants.usage import UsageEvent, UsageTally, cost_usd, minute_of, split_by_tokens
from conveyor.tenants.usage_report import parse_query, usage_page


def test_model_time_is_split_by_tokens_and_priced_by_the_hour() -> None:
    assert split_by_tokens(1.0, [1, 3]) == [0.25, 0.75]
    assert split_by_tokens(1.0, [0, 0]) == [0.5, 0.5]
    assert split_by_tokens(1.0, []) == []
    assert cost_usd(1800, 2.5) == 1.25
    assert minute_of(125.9) == 120


def test_the_tally_sums_by_tenant_model_and_minute() -> None:
    tally = UsageTally()
    tally.record(UsageEvent("a", "m", 3, 4, 0.5, 0.1), now_s=61)
    tally.record(UsageEvent("a", "m", 1, 1, 0.5, 0.1), now_s=119)
    tally.record(UsageEvent("a", "m", 1, 1, 0.5, 0.1), now_s=120)
    first, second = tally.take()
    assert (first.minute_start, first.num_requests, first.input_tokens) == (60, 2, 4)
    assert (second.minute_start, second.num_requests) == (120, 1)
    assert len(tally) == 0


def test_the_page_buckets_rows_and_groups_them() -> None:
    rows = [
        UsageRow("a", "m", 60, 1, 5),
        UsageRow("a", "n", 120, 2, 7),
        UsageRow("b", "m", 3600, 1, 1),
    ]
    query = parse_query(0, 7200, "1h", ["model"], None, now_s=9999)
    page = usage_page(query, rows)
    assert [b["start_time"] for b in page["data"]] == [0, 3600]  # type: ignore[index]
    first = page["data"][0]["results"]  # type: ignore[index]
    assert {r["model"]: r["input_tokens"] for r in first} == {"m": 5, "n": 7}
    limited = usage_page(parse_query(0, 7200, "1m", [], 2, now_s=0), rows)
    assert limited["has_more"] is True and limited["next_page"] == "120"
    with pytest.raises(InvalidRequest):
        parse_query(None, None, "1h", [], None, now_s=0)
    with pytest.raises(InvalidRequest):
        parse_query(0, None, "2h", [], None, now_s=0)
    with pytest.raises(InvalidRequest):
        parse_query(0, None, "1d", ["user"], None, now_s=0)


class FlakyStore:
    """A usage store that fails while `is_down`."""

    def __init__(self) -> None:
        self.is_down = True
        self.rows: list[UsageRow] = []

    def add_usage(self, rows: Sequence[UsageRow]) -> None:
        if self.is_down:
            raise StoreError("down")
        self.rows.extend(rows)

    def list_usage(
        self, start_s: int, end_s: int | None = None, tenant: str | None = None
    ) -> list[UsageRow]:
        return list(self.rows)


@pytest.mark.anyio
async def test_a_failed_flush_keeps_the_rows_and_stop_writes_them() -> None:
    ledger, store = UsageLedger(flush_every_s=3600), FlakyStore()
    ledger.start(store)
    ledger.record(UsageEvent("a", "m", 2, 3, 0.1, 0.0), now_s=60)
    assert await ledger.flush() == 0 and ledger.num_pending_rows == 1
    ledger.record(UsageEvent("a", "m", 2, 3, 0.1, 0.0), now_s=61)
    store.is_down = False
    await ledger.stop()
    (row,) = store.rows
    assert (row.num_requests, row.input_tokens, row.output_tokens) == (2, 4, 6)
