"""Ledger rows as OpenAI's organization usage page: time buckets of grouped results. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from conveyor.errors import InvalidRequest
from conveyor.stores.tenant_records import UsageRow

BUCKET_WIDTH_S = {"1m": 60, "1h": 3600, "1d": 86_400}
# OpenAI's bucket limits per width: (default, maximum).
BUCKET_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
GROUP_FIELDS = frozenset({"model", "tenant"})
RESULT_OBJECT = "organization.usage.completions.result"
# 9999-12-31T23:59:59Z: times past it (or before 1970) are no one's usage, and would
# overflow a store's 64-bit integers long before Python's ints do.
MAX_UNIX_S = 253_402_300_799


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """A checked usage query: buckets `[start_s, end_s)` of `width_s`, at most `limit`."""

    start_s: int
    end_s: int
    bucket_width: str
    group_by: tuple[str, ...]
    limit: int

    @property
    def width_s(self) -> int:
        """Seconds per bucket."""
        return BUCKET_WIDTH_S[self.bucket_width]

    def bucket_starts(self) -> list[int]:
        """Every bucket's start (aligned to the width), oldest first, one past the limit."""
        first = self.start_s // self.width_s * self.width_s
        starts = range(first, self.end_s, self.width_s)
        return list(starts[: self.limit + 1])


def parse_query(
    start_time: int | None,
    end_time: int | None,
    bucket_width: str | None,
    group_by: Sequence[str],
    limit: int | None,
    now_s: int,
) -> UsageQuery:
    """Check the query parameters (400 naming the wrong one)."""
    if start_time is None:
        raise InvalidRequest("missing required parameter: 'start_time'", param="start_time")
    for name, value in (("start_time", start_time), ("end_time", end_time)):
        if value is not None and not 0 <= value <= MAX_UNIX_S:
            raise InvalidRequest(f"{name} must be unix seconds, 0..{MAX_UNIX_S}", param=name)
    width = bucket_width or "1d"
    if width not in BUCKET_WIDTH_S:
        raise InvalidRequest("bucket_width must be 1m, 1h or 1d", param="bucket_width")
    unknown = sorted(set(group_by) - GROUP_FIELDS)
    if unknown:
        raise InvalidRequest(f"cannot group usage by {unknown}", param="group_by")
    default_limit, max_limit = BUCKET_LIMITS[width]
    limit = default_limit if limit is None else limit
    if not 1 <= limit <= max_limit:
        raise InvalidRequest(f"limit must be 1..{max_limit} for {width}", param="limit")
    end_s = now_s + 1 if end_time is None else end_time
    if end_s <= start_time:
        raise InvalidRequest("end_time must be after start_time", param="end_time")
    return UsageQuery(start_time, end_s, width, tuple(dict.fromkeys(group_by)), limit)


def usage_page(query: UsageQuery, rows: Iterable[UsageRow]) -> dict[str, object]:
    """OpenAI's usage page: a bucket per width step, each with results per group."""
    starts = query.bucket_starts()
    has_more = len(starts) > query.limit
    starts = starts[: query.limit]
    grouped: dict[int, dict[tuple[str | None, ...], UsageTotals]] = {s: {} for s in starts}
    for row in rows:
        bucket = row.minute_start // query.width_s * query.width_s
        if bucket not in grouped:
            continue
        key = tuple(row.model if f == "model" else row.tenant for f in query.group_by)
        grouped[bucket].setdefault(key, UsageTotals()).add(row)
    data = [
        {
            "object": "bucket",
            "start_time": start,
            "end_time": min(start + query.width_s, query.end_s),
            "results": [t.result(query.group_by, k) for k, t in grouped[start].items()],
        }
        for start in starts
    ]
    next_page = str(starts[-1] + query.width_s) if has_more else None
    return {"object": "page", "data": data, "has_more": has_more, "next_page": next_page}


class UsageTotals:
    """Sums of ledger rows for one result."""

    __slots__ = ("cost_usd", "input_tokens", "model_s", "num_requests", "output_tokens")

    def __init__(self) -> None:
        """Zero use."""
        self.num_requests = self.input_tokens = self.output_tokens = 0
        self.model_s = self.cost_usd = 0.0

    def add(self, row: UsageRow) -> None:
        """Fold one row in."""
        self.num_requests += row.num_requests
        self.input_tokens += row.input_tokens
        self.output_tokens += row.output_tokens
        self.model_s += row.model_s
        self.cost_usd += row.cost_usd

    def result(self, group_by: Sequence[str], key: Sequence[str | None]) -> dict[str, object]:
        """OpenAI's completions usage result plus model-seconds and cost."""
        body: dict[str, object] = {
            "object": RESULT_OBJECT,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "input_cached_tokens": 0,
            "num_model_requests": self.num_requests,
            "model_seconds": self.model_s,
            "cost_usd": self.cost_usd,
            "model": None,
        }
        body.update(zip(group_by, key, strict=True))
        return body
