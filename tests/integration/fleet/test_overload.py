"""Ten times a worker's capacity through a gateway: refusals are 429s, never 5xx."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.fleet.conftest import (
    MODEL,
    SYNTHETIC,
    Fleet,
    embed,
    routable_ids,
)
from tests.overload import burst, statuses
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# Batches of 4 inputs every 200 ms: the worker serves 20 inputs/s; 200/s is ten times that.
SLOW_WORKER = {**SYNTHETIC, "max_batch_size": 4, "batch_latency_ms": 200, "max_wait_ms": 0}
RATE_PER_S = 200
NUM_REQUESTS = 400
TIMEOUT_MS = 2000


def test_ten_times_capacity_through_a_gateway_is_refused_with_429s(fleet: Fleet) -> None:
    """The worker's 429s (with Retry-After) pass through; what it admits meets the
    deadline, so neither it nor the gateway answers 504."""
    worker = fleet.start_worker("a", config={"models": [SLOW_WORKER]})
    gateway = fleet.start_gateway()
    until(lambda: routable_ids(gateway) == {"a"}, "the worker routable", timeout_s=5)
    with httpx.Client() as client:  # the model learns its batch time from three batches
        for index in range(3):
            assert embed(client, gateway, f"warm-up {index}").status_code == 200
    answers = burst(
        f"{gateway.url}/v1/embeddings", {"model": MODEL, "input": ["x"]},
        num_requests=NUM_REQUESTS, rate_per_s=RATE_PER_S, timeout_ms=TIMEOUT_MS,
    )  # fmt: skip
    counts = statuses(answers)
    assert set(counts) == {200, 429}, counts
    assert counts[200] >= 20, counts
    refused = [answer for answer in answers if answer.status == 429]
    assert all(int(answer.retry_after or 0) >= 1 for answer in refused)
    assert worker.metric("conveyor_requests_total", model=MODEL, outcome="deadline") == 0
