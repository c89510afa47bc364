"""`conveyor plan --calibrate` against a running synthetic model recovers what the model
costs.

The synthetic model sleeps a known time per batch (100 ms, plus 2 ms an input, at most 16
inputs), so a calibration can only measure that or more: on a busy machine the batches
run late, never early. The check is on the calibrated cost, which is behaviour; whether
the plan's throughput and p99 then hold under load is a speed figure, measured by
`bench.plan_accuracy` for this model and the tiny Llama (its smoke run is in the
integration tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
from bench.plan_accuracy import SYN, run_plan

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

MAX_BATCH = cast(int, SYN["max_batch_size"])
FULL_BATCH_MS = cast(float, SYN["batch_latency_ms"]) + cast(float, SYN["per_item_ms"]) * MAX_BATCH


def test_calibration_recovers_the_synthetic_models_batch_cost(
    server_factory: Callable[[dict[str, Any]], Server],
) -> None:
    server = server_factory({"models": [SYN]})
    plan = run_plan(server.url, "--served-model", "syn", "--qps", "60", "--prompt-tokens", "8",
                    "--max-batch", "32", "--max-wait-ms", "5")  # fmt: skip
    assert plan["kind"] == "one-shot"
    assert plan["max_batch"] == MAX_BATCH  # found by probing, not configured
    # Never below what the model sleeps; within half again of it even on a busy machine.
    assert FULL_BATCH_MS * 0.98 <= plan["batch_ms_at_max"] <= FULL_BATCH_MS * 1.5
    ceiling = MAX_BATCH / (FULL_BATCH_MS / 1000)
    assert ceiling / 1.5 <= plan["inputs_per_s_per_replica"] <= ceiling * 1.02
