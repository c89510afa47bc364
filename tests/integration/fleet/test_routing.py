"""Gateways route to healthy workers: model union, two gateways, stale workers skipped."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from tests.integration.fleet.conftest import (
    MODEL,
    STALE_AFTER_S,
    SYNTHETIC,
    Fleet,
    Proc,
    embed,
    fleet_doc,
    routable_ids,
)
from tests.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_two_gateways_route_to_fresh_workers_only(fleet: Fleet) -> None:
    # "c" registers once and never beats again, so it goes stale while still alive.
    stale = fleet.start_worker("c", heartbeat_s=600)
    fleet.start_worker("a")
    fleet.start_worker("b", config={"models": [SYNTHETIC, {**SYNTHETIC, "name": "other"}]})
    gateways = [fleet.start_gateway("g1"), fleet.start_gateway("g2")]
    for gateway in gateways:

        def is_c_stale(g: Proc = gateway) -> bool:
            return routable_ids(g) == {"a", "b"}

        until(is_c_stale, "c stale", timeout_s=10 * STALE_AFTER_S)
    workers = {p.name: p for p in fleet.procs}
    before = {name: workers[name].num_ok() for name in "abc"}
    with httpx.Client() as client:
        for i in range(30):
            for gateway in gateways:
                response = embed(client, gateway, f"text {i}")
                assert response.status_code == 200, response.text
                assert len(response.json()["data"][0]["embedding"]) == SYNTHETIC["dim"]
    assert workers["c"].num_ok() == before["c"]
    assert workers["a"].num_ok() > before["a"]
    assert workers["b"].num_ok() > before["b"]
    assert stale.process.poll() is None


def test_models_are_the_union_of_healthy_workers(fleet: Fleet) -> None:
    fleet.start_worker("a")
    fleet.start_worker("b", config={"models": [{**SYNTHETIC, "name": "other"}]})
    gateway = fleet.start_gateway()
    until(lambda: routable_ids(gateway) == {"a", "b"}, "both workers routable", timeout_s=5)
    models = httpx.get(f"{gateway.url}/v1/models").json()
    assert sorted(m["id"] for m in models["data"]) == sorted([MODEL, "other"])
    response = httpx.post(f"{gateway.url}/v1/embeddings", json={"model": "nope", "input": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "model"


def test_fleet_status_and_scaling_signal(fleet: Fleet) -> None:
    worker_a = fleet.start_worker("a")
    gateway = fleet.start_gateway()
    until(lambda: routable_ids(gateway) == {"a"}, "worker routable", timeout_s=5)
    with httpx.Client() as client:
        for i in range(20):
            assert embed(client, gateway, f"t{i}").status_code == 200
    doc = fleet_doc(gateway)
    (worker,) = doc["workers"]
    assert worker["models"] == [MODEL]
    assert worker["heartbeat_age_s"] < STALE_AFTER_S
    assert set(worker["load"]["models"][MODEL]) >= {"queue_depth", "service_per_s"}
    assert doc["models"][MODEL]["arrival_per_s"] > 0
    assert doc["models"][MODEL]["num_replicas"] == 1
    until(
        lambda: gateway.metric("conveyor_desired_replicas", model=MODEL) >= 1, "gauge", timeout_s=5
    )
    assert gateway.metric("conveyor_gateway_requests_total", model=MODEL, code="200") == 20
    # A worker also speaks vLLM's names, for gateways and autoscalers that read those.
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{worker_a.url}/metrics").text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip
    labels = (("engine", "0"), ("model_name", MODEL))
    assert samples[("vllm:num_requests_waiting", labels)] == 0  # idle after the requests
    assert samples[("vllm:num_requests_running", labels)] == 0


def test_gateway_processes_share_one_port_and_stop_together(fleet: Fleet) -> None:
    fleet.start_worker("a")
    gateway = fleet.start_gateway(extra_args=("--processes", "2"))
    pids: set[int] = set()

    def both_answer() -> bool:
        # A fresh connection each time: the kernel spreads connections over the processes.
        pids.add(httpx.get(f"{gateway.url}/health", timeout=5).json()["pid"])
        return len(pids) == 2

    until(both_answer, "both gateway processes answering", timeout_s=30)
    until(lambda: routable_ids(gateway) == {"a"}, "a routable", timeout_s=10)
    for i in range(20):
        with httpx.Client() as client:  # new connections: both processes proxy
            assert embed(client, gateway, f"text {i}").status_code == 200
    gateway.process.send_signal(signal.SIGINT)
    assert gateway.process.wait(timeout=30) == 0, gateway.log()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
