"""`conveyor usage [--since 24h]`: what each tenant used of each model, read from the job store."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from conveyor.cli.keys import DataDirOption, StoreOption, opened_store
from conveyor.stores.tenant_records import UsageRow
from conveyor.tenants.usage import merge_rows

_SPAN = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def span_s(text: str) -> int:
    """Seconds in a span like `30m`, `24h` or `7d` (BadParameter otherwise)."""
    match = _SPAN.match(text.strip())
    if match is None:
        raise typer.BadParameter(f"want a number and s, m, h or d (like 24h), got {text!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def totals(rows: list[UsageRow]) -> list[UsageRow]:
    """One row per tenant and model over the whole span, largest cost first."""
    flat = [
        UsageRow(r.tenant, r.model, 0, r.num_requests, r.input_tokens, r.output_tokens,
                 r.model_s, r.cost_usd)
        for r in rows
    ]  # fmt: skip
    return sorted(merge_rows(flat), key=lambda r: (-r.cost_usd, r.tenant, r.model))


def usage_command(
    since: Annotated[str, typer.Option("--since", help="How far back: 30m, 24h, 7d.")] = "24h",
    store: StoreOption = None,
    data_dir: DataDirOption = Path("data"),
) -> None:
    """Print a table of requests, tokens, model-seconds and cost by tenant and model."""
    start_s = int(time.time()) - span_s(since)
    with opened_store(store, data_dir) as job_store:
        rows = totals(job_store.list_usage(start_s // 60 * 60))
    table = Table("tenant", "model", "requests", "input tokens", "output tokens",
                  "model s", "cost USD")  # fmt: skip
    for row in rows:
        table.add_row(
            row.tenant, row.model, str(row.num_requests), str(row.input_tokens),
            str(row.output_tokens), f"{row.model_s:.3f}", f"{row.cost_usd:.4f}",
        )  # fmt: skip
    Console(width=120).print(table)
