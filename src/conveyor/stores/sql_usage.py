"""The usage ledger over SQL: one row per tenant, model and minute, summed on write."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.stores.sql_base import SqlStore
from conveyor.stores.sql_queries import Dialect, SqlSession, shared
from conveyor.stores.tenant_records import USAGE_COLUMNS, UsageRow

# Both dialects spell the upsert the same way (`excluded` is the row that was refused).
ADD_USAGE = shared(
    "add_usage",
    f"INSERT INTO usage_minutes ({USAGE_COLUMNS}) VALUES (:tenant, :model, :minute_start, "
    ":num_requests, :input_tokens, :output_tokens, :model_s, :cost_usd) "
    "ON CONFLICT (tenant, minute_start, model) DO UPDATE SET "
    "num_requests = usage_minutes.num_requests + excluded.num_requests, "
    "input_tokens = usage_minutes.input_tokens + excluded.input_tokens, "
    "output_tokens = usage_minutes.output_tokens + excluded.output_tokens, "
    "model_s = usage_minutes.model_s + excluded.model_s, "
    "cost_usd = usage_minutes.cost_usd + excluded.cost_usd",
)

LIST_USAGE = shared(
    "list_usage",
    f"SELECT {USAGE_COLUMNS} FROM usage_minutes WHERE minute_start >= :start_s "
    "AND (CAST(:end_s AS BIGINT) IS NULL OR minute_start < :end_s) "
    "AND (CAST(:tenant AS TEXT) IS NULL OR tenant = :tenant) "
    "ORDER BY minute_start, tenant, model",
)

ADD_SHARD_TOKENS = shared(
    "add_shard_tokens",
    "UPDATE shards SET input_tokens = :input_tokens, output_tokens = :output_tokens "
    "WHERE batch_id = :batch_id AND shard_index = :shard_index",
)


def add_usage_rows(session: SqlSession, dialect: Dialect, rows: Sequence[UsageRow]) -> None:
    """Add `rows` to the ledger inside the caller's transaction."""
    if not rows:
        return
    params = [
        {
            "tenant": row.tenant,
            "model": row.model,
            "minute_start": row.minute_start,
            "num_requests": row.num_requests,
            "input_tokens": row.input_tokens,
            "output_tokens": row.output_tokens,
            "model_s": row.model_s,
            "cost_usd": row.cost_usd,
        }
        for row in rows
    ]
    session.execute_many(ADD_USAGE.text(dialect), params)


class SqlUsageStore(SqlStore):
    """`UsageStore` over SQL."""

    def add_usage(self, rows: Sequence[UsageRow]) -> None:
        """Add each row to its (tenant, model, minute) row, all in one transaction."""
        if not rows:
            return
        with self._session(is_write=True) as session:
            add_usage_rows(session, self._dialect, rows)

    def list_usage(
        self, start_s: int, end_s: int | None = None, tenant: str | None = None
    ) -> list[UsageRow]:
        """Rows with `start_s <= minute_start < end_s` (of `tenant`, or all), oldest first."""
        params = {"start_s": int(start_s), "end_s": end_s, "tenant": tenant}
        return [UsageRow.from_row(row) for row in self._rows(LIST_USAGE, params)]
