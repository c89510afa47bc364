"""The large-body benchmark's smoke mode runs both large requests end to end and reports
every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_smoke import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_writes_json_and_png(tmp_path: Path) -> None:
    out = run_smoke("bench.large_body", tmp_path)
    result = json.loads((out / "large_body.json").read_text())
    summary = result["summary"]
    assert set(summary) == {"idle_p50_ms", "idle_max_ms", "during_p50_ms", "during_max_ms",
                            "chat_seconds", "response_mb", "rss_growth_mb"}  # fmt: skip
    assert result["runs"][0]["chat"]["status"] == 400
    assert len(result["runs"][0]["during_ms"]) >= 1
    assert (out / "large_body.png").stat().st_size > 0
    answer = json.loads((out / "large_answer.json").read_text())
    assert answer["runs"][0]["chat"]["status"] == 200
    assert answer["summary"]["response_mb"] > 0.05  # 4 x 50 tokens x 21 logprob entries
    assert (out / "large_answer.png").stat().st_size > 0
