"""The soak benchmark's smoke mode runs the synthetic case end to end and reports every goal;
its SmolLM2 chat cases serve the bundled GGUF as ``conveyor serve`` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.soak import SERVED_CHAT, chat_entry

from conveyor.config.model_config import bundled_chat_model_path
from conveyor.config.settings import DEFAULT_CHAT_MODEL_SETTINGS
from tests.bench_smoke import run_smoke


@pytest.mark.slow
def test_smoke_writes_json_and_png(tmp_path: Path) -> None:
    out = run_smoke("bench.soak", tmp_path)
    result = json.loads((out / "soak.json").read_text())
    case = result["cases"]["syn-soak"]
    assert case["ceiling_per_s"] == 2000.0
    assert case["full_batch_ms"] == 50.0
    summary = case["summary"]
    for key in ("idle_p99_ms", "soak_p99_ms", "soak_p99_limit_ms", "job_alone_share",
                "job_beside_online_share", "goal_p99_met", "goal_alone_met", "goal_beside_met"):  # fmt: skip
        assert key in summary
    rep = case["reps"][0]
    assert rep["job_outlasted_window"] is True
    assert rep["soak"]["num_errors"] == 0 and rep["idle"]["num_errors"] == 0
    assert (out / "soak.png").stat().st_size > 0


def test_the_smollm2_chat_cases_serve_the_bundled_gguf_as_serve_does(tmp_path: Path) -> None:
    capped = chat_entry(tmp_path, None, "smollm2")
    assert capped["path"] == str(bundled_chat_model_path()) and capped["name"] == SERVED_CHAT
    assert capped.items() >= DEFAULT_CHAT_MODEL_SETTINGS.items()
    assert "job_tokens_beside_online" not in capped  # the model's default cap
    assert chat_entry(tmp_path, 8, "smollm2")["job_tokens_beside_online"] == 8
    assert chat_entry(tmp_path, 8, "smollm2-uncapped")["job_tokens_beside_online"] is None
    assert not list(tmp_path.iterdir())  # nothing built
