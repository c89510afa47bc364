"""`conveyor usage`: a table of the ledger's totals since a span ago."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from conveyor.cli.main import app
from conveyor.cli.usage import span_s
from conveyor.stores import open_job_store
from conveyor.stores.tenant_records import UsageRow


def test_usage_prints_each_tenant_and_model_since_the_span(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/jobs.sqlite"
    minute = int(time.time()) // 60 * 60
    store = open_job_store(url)
    store.add_usage([
        UsageRow("acme", "llama", minute, 2, 100, 50, 1.5, 0.001),
        UsageRow("acme", "llama", minute - 60, 1, 10, 5, 0.5, 0.0003),
        UsageRow("globex", "llama", minute - 3 * 86_400, 9, 9, 9, 9.0, 9.0),
    ])  # fmt: skip
    store.close()
    result = CliRunner().invoke(app, ["usage", "--since", "1h", "--store", url])
    assert result.exit_code == 0, result.output
    assert "acme" in result.output and "110" in result.output and "globex" not in result.output


def test_spans_need_a_unit() -> None:
    assert span_s("24h") == 86_400 and span_s("30m") == 1800
    with pytest.raises(typer.BadParameter):
        span_s("24")
