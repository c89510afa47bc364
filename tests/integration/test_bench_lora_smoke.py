"""The LoRA benchmark's smoke mode runs every case end to end and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.lora import CASES, model_of

from tests.bench_smoke import run_smoke


@pytest.mark.slow
def test_smoke_reports_every_case_and_writes_a_png(tmp_path: Path) -> None:
    out = run_smoke("bench.lora", tmp_path)
    result = json.loads((out / "lora.json").read_text())
    assert result["inputs"]["is_smoke"] is True
    assert set(result["rounds"]) == set(CASES)
    for case in CASES:
        summary = result["summary"][case]
        assert summary["num_output_tokens"] == 8 * 8  # every request made max_tokens tokens
        assert summary["output_tokens_per_s"] > 0
        assert summary["best_output_tokens_per_s"] >= summary["output_tokens_per_s"]
    assert result["summary"]["base"]["over_base"] == 1.0
    assert (out / "lora.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_requests_spread_over_the_case_adapters() -> None:
    assert {model_of("base", i) for i in range(40)} == {"llama"}
    assert {model_of("lora_1", i) for i in range(40)} == {"a0"}
    assert len({model_of("lora_8", i) for i in range(40)}) == 8
    assert len({model_of("lora_32", i) for i in range(40)}) == 32
