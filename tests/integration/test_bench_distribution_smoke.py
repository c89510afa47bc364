"""The distribution benchmark's smoke mode runs end to end and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_smoke import run_smoke

pytestmark = pytest.mark.slow


def test_smoke_writes_json_and_png(tmp_path: Path) -> None:
    pytest.importorskip("flask", reason="the S3 origin is moto's server (moto[server])")
    out = run_smoke("bench.distribution", tmp_path)
    result = json.loads((out / "distribution.json").read_text())
    model_bytes = result["inputs"]["model_bytes"]
    by_mode = {run["mode"]: run for run in result["runs"]}
    assert set(by_mode) == {"naive", "p2p"}
    naive, p2p = by_mode["naive"], by_mode["p2p"]
    # Naive: every worker pulls the whole model from the origin, none from peers.
    assert naive["fetched_origin_bytes"] == 2 * model_bytes
    assert naive["fetched_peer_bytes"] == 0
    # Peer to peer: each worker ends with the whole model; the origin is asked less.
    assert p2p["fetched_origin_bytes"] + p2p["fetched_peer_bytes"] == 2 * model_bytes
    assert p2p["proxy_origin_bytes"] < naive["proxy_origin_bytes"]
    assert naive["proxy_origin_bytes"] >= 2 * model_bytes  # payload plus HTTP framing
    assert result["summary"]["naive_origin_x_model"] >= 2
    assert (out / "distribution.png").stat().st_size > 0
