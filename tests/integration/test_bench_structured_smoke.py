"""The structured-output benchmark's smoke mode measures both cases and the mask's cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_smoke import run_smoke


@pytest.mark.slow
def test_smoke_reports_both_cases_and_the_mask_cost(tmp_path: Path) -> None:
    out = run_smoke("bench.structured", tmp_path)
    result = json.loads((out / "structured.json").read_text())
    summary = result["summary"]
    assert result["inputs"]["is_smoke"] is True
    for case in ("free", "schema"):
        # every request made exactly max_tokens tokens in both cases
        assert summary[case]["num_output_tokens"] == 4 * 16
        assert summary[case]["output_tokens_per_s"] > 0
    assert summary["schema"]["mask_s_per_token"] > 0  # the grammar really ran
    assert summary["free"]["mask_s_per_token"] == 0
    assert summary["schema_over_free_throughput"] > 0
    assert (out / "structured.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
