"""A worker killed or drained under load: requests move to the survivors."""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.integration.fleet.conftest import (
    HEARTBEAT_S,
    STALE_AFTER_S,
    Fleet,
    embed,
    routable_ids,
)
from tests.integration.fleet.load import SteadyLoad
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NUM_REQUESTS = 600


def test_sigkill_under_load_moves_traffic_to_survivors(fleet: Fleet) -> None:
    workers = [fleet.start_worker(name) for name in ("a", "b", "c")]
    gateway = fleet.start_gateway()
    until(lambda: routable_ids(gateway) == {"a", "b", "c"}, "three routable workers", timeout_s=5)
    load = SteadyLoad(gateway, num_requests=NUM_REQUESTS)
    until(lambda: load.num_done >= NUM_REQUESTS // 4, "a quarter of the load", timeout_s=60)
    workers[0].process.send_signal(signal.SIGKILL)
    # Gone from the routing table within a few heartbeats (passive ejection is faster).
    until(
        lambda: "a" not in routable_ids(gateway), "eject", timeout_s=STALE_AFTER_S + 5 * HEARTBEAT_S
    )
    outcome = load.wait()
    assert outcome.hung == 0
    assert outcome.num_sent == NUM_REQUESTS
    assert outcome.num_ok >= 0.99 * NUM_REQUESTS, outcome
    # Whatever failed failed clearly: an OpenAI-shaped error, never a hang.
    for body in outcome.error_bodies:
        assert "error" in body
    assert workers[1].num_ok() > 0 and workers[2].num_ok() > 0


def test_sigterm_drains_without_loss_and_a_restarted_worker_rejoins(fleet: Fleet) -> None:
    draining = fleet.start_worker("a")
    fleet.start_worker("b")
    gateway = fleet.start_gateway()
    until(lambda: routable_ids(gateway) == {"a", "b"}, "two routable workers", timeout_s=5)
    load = SteadyLoad(gateway, num_requests=NUM_REQUESTS // 2)
    until(lambda: load.num_done >= NUM_REQUESTS // 8, "some of the load", timeout_s=60)
    draining.process.send_signal(signal.SIGTERM)
    assert draining.process.wait(timeout=30) == 0, draining.log()
    outcome = load.wait()
    assert outcome.num_ok == NUM_REQUESTS // 2, outcome
    until(lambda: routable_ids(gateway) == {"b"}, "a deregistered", timeout_s=5)
    restarted = fleet.start_worker("a")
    until(lambda: routable_ids(gateway) == {"a", "b"}, "a rejoined", timeout_s=5)
    with httpx.Client() as client:
        for i in range(40):
            assert embed(client, gateway, f"after {i}").status_code == 200
    assert restarted.num_ok() > 0
