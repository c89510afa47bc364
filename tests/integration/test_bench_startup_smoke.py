"""The start-up benchmark's smoke mode serves SmolLM2 from its GGUF and reports its time and
memory (a full run adds the imported directory and the default set)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_smoke import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_writes_json_and_png(tmp_path: Path) -> None:
    out = run_smoke("bench.startup", tmp_path)
    result = json.loads((out / "startup.json").read_text())
    assert set(result["summary"]) == {"gguf"}
    figures = result["summary"]["gguf"]
    assert figures["ready_s_median"] > 0 and figures["peak_rss_mb_median"] > 100
    assert result["inputs"]["gguf_bytes"] > 0 and result["inputs"]["imported_bytes"] is None
    assert (out / "startup.png").stat().st_size > 0
