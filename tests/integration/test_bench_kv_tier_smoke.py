"""The KV host-tier benchmark: its smoke mode runs every contender and reports each figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench.kv_tier import CONTENDERS, evaluate, final_context, parse_options, pool_blocks

from tests.bench_smoke import run_smoke


@pytest.mark.slow
@pytest.mark.model
def test_smoke_reports_every_contender(tmp_path: Path) -> None:
    out = run_smoke("bench.kv_tier", tmp_path)
    result: dict[str, Any] = json.loads((out / "kv_tier.json").read_text())
    assert result["inputs"]["is_smoke"] is True
    for contender in CONTENDERS:
        (run,) = result["runs"][contender]
        assert 0 < run["resumed_ttft_ms"]["p50"] <= run["resumed_ttft_ms"]["p99"]
        assert 0 <= run["resumed_hit_share"] <= 1
    tier = result["runs"]["host_tier"][0]
    assert tier["tier_hit_blocks"]["host"] > 0 and tier["tier_bytes"]["host_to_device"] > 0
    assert result["runs"]["recompute"][0]["tier_hit_blocks"] is None
    # The pool alone kept nothing for resumed turns (the smoke run's pauses outlast every
    # session's first turn, on a quiet machine as on a busy one); the tier brought it back.
    shares = {c: result["runs"][c][0]["resumed_hit_share"] for c in CONTENDERS}
    assert shares["recompute"] == 0
    assert shares["host_tier"] > shares["recompute"]
    assert (out / "kv_tier.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_pool_holds_a_third_of_the_contexts_and_the_roomy_one_all() -> None:
    opts = parse_options([])
    assert (opts.num_sessions, opts.num_turns, opts.repeats) == (16, 3, 1)
    blocks_each = -(-final_context(opts) // opts.block_size) + 1
    assert pool_blocks(opts, "recompute") == int(16 * blocks_each / 3)
    assert pool_blocks(opts, "roomy_pool") > 16 * blocks_each


def test_evaluate_compares_with_recompute() -> None:
    def run(p50: float) -> dict[str, Any]:
        return {"resumed_ttft_ms": {"p50": p50, "p99": 2 * p50}, "resumed_hit_share": 0.5}

    runs = {"recompute": [run(400)], "host_tier": [run(100)], "roomy_pool": [run(80)]}
    summary = evaluate(runs)
    assert summary["tier_ttft_p50_vs_recompute"] == 0.25
    assert summary["roomy_ttft_p50_vs_recompute"] == 0.2
