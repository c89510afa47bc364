"""The sampler benchmark's smoke mode times both draws at each batch size."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from bench.sampler import race

from tests.bench_smoke import run_smoke


def test_smoke_times_both_draws(tmp_path: Path) -> None:
    out = run_smoke("bench.sampler", tmp_path)
    result = json.loads((out / "sampler.json").read_text())
    assert result["inputs"]["is_smoke"] is True
    assert [row["rows"] for row in result["results"]] == [16, 64]
    for row in result["results"]:
        assert row["race_ms"] > 0 and row["sampler_ms"] > 0


def test_the_reference_race_never_draws_a_masked_token() -> None:
    logits = torch.tensor([[0.0, -torch.inf, 0.0, -torch.inf]]).expand(200, 4)
    tokens = race(logits)
    assert set(tokens) == {0, 2}
