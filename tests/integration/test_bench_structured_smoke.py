"""The structured-output benchmark's smoke mode measures both cases and the mask's cost; its
SmolLM2 case serves the bundled GGUF."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from bench.structured import model_path, result_name

from conveyor.config.model_config import bundled_chat_model_path
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


def test_the_smollm2_case_serves_the_bundled_gguf(tmp_path: Path) -> None:
    opts = argparse.Namespace(model="smollm2", smoke=False)
    assert model_path(opts, tmp_path) == bundled_chat_model_path()
    assert not list(tmp_path.iterdir())  # nothing built
    assert result_name(opts) == "structured_smollm2"
    assert result_name(argparse.Namespace(model="llama")) == "structured"
