"""Overload, deadlines, disconnects and API keys on real server processes."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest

from tests.e2e.conftest import Server
from tests.overload import burst, statuses
from tests.polling import until

pytestmark = pytest.mark.slow


def slow_model(**overrides: object) -> dict[str, object]:
    model: dict[str, object] = {
        "name": "slow",
        "kind": "synthetic",
        "max_batch_size": 1,
        "max_wait_ms": 0,
        "max_queue": 2,
        "timeout_ms": 30000,
        "batch_latency_ms": 300,
        "dim": 4,
    }
    model.update(overrides)
    return {"models": [model]}


def post(server: Server, text: str, **kw: object) -> httpx.Response:
    return httpx.post(f"{server.api}/embeddings", json={"model": "slow", "input": text}, **kw)  # type: ignore[arg-type]


def test_queue_full_gets_429_with_computed_retry_after(server_factory) -> None:
    server: Server = server_factory(slow_model())
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: post(server, f"x{i}", timeout=30), range(8)))
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 429 in statuses
    rejected = next(r for r in responses if r.status_code == 429)
    assert int(rejected.headers["Retry-After"]) >= 1
    assert rejected.json()["error"]["code"] == "queue_full"
    assert (
        server.metric("conveyor_requests_total", model="slow", outcome="rejected_queue_full") >= 1
    )
    assert post(server, "after the storm", timeout=30).status_code == 200


# Ten times what the model serves: batches of 4 inputs every 200 ms are 20 inputs/s.
OVERLOAD_MODEL = {"max_batch_size": 4, "batch_latency_ms": 200, "max_queue": 2048}
OVERLOAD_RATE_PER_S = 200
OVERLOAD_REQUESTS = 400  # two seconds of it
OVERLOAD_TIMEOUT_MS = 2000  # ten batches: the queue a request can wait through


def test_ten_times_capacity_is_refused_with_429s_and_never_a_5xx(server_factory) -> None:
    """Refusals for the load are 429s with Retry-After; every admitted request meets its
    deadline, so nothing is a 504 (or any 5xx)."""
    server: Server = server_factory(slow_model(**OVERLOAD_MODEL))
    # The model learns its batch time from its first three batches (until then it admits
    # up to the queue bound): one request each.
    for index in range(3):
        assert post(server, f"warm-up {index}", timeout=30).status_code == 200
    answers = burst(
        f"{server.api}/embeddings", {"model": "slow", "input": "x"},
        num_requests=OVERLOAD_REQUESTS, rate_per_s=OVERLOAD_RATE_PER_S,
        timeout_ms=OVERLOAD_TIMEOUT_MS,
    )  # fmt: skip
    counts = statuses(answers)
    assert set(counts) == {200, 429}, counts
    assert counts[200] >= 20, counts  # the model kept serving at its rate meanwhile
    refused = [answer for answer in answers if answer.status == 429]
    assert {answer.code for answer in refused} <= {"deadline_unreachable", "queue_full"}
    assert all(int(answer.retry_after or 0) >= 1 for answer in refused)
    assert server.metric("conveyor_requests_total", model="slow", outcome="deadline") == 0


BLOCKER_MS = 2000  # the blocker holds the model this long: a window, not a guess at order
POLL_S = 0.02
WAIT_S = 30.0


def blocked_model() -> dict[str, object]:
    """A fast model whose inputs containing "blocker" hold it for BLOCKER_MS."""
    return slow_model(max_queue=10, batch_latency_ms=20, slow_marker="blocker", slow_ms=BLOCKER_MS)


def wait_for_metric(server: Server, value: float, name: str, **labels: str) -> None:
    """Poll /metrics until the sample equals ``value``; fail after WAIT_S."""
    until(lambda: server.metric(name, **labels) == value, f"{name}{labels} to reach {value}",
          timeout_s=WAIT_S, interval_s=POLL_S)  # fmt: skip


def start_blocker(
    server: Server, pool: concurrent.futures.ThreadPoolExecutor
) -> concurrent.futures.Future[httpx.Response]:
    """Send the blocker and return once it is running on the model."""
    blocker = pool.submit(post, server, "blocker", timeout=WAIT_S)
    wait_for_metric(server, 1, "conveyor_in_flight", model="slow")
    return blocker


def test_deadline_in_queue_is_504_and_input_never_runs(server_factory) -> None:
    server: Server = server_factory(blocked_model())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        blocker = start_blocker(server, pool)
        doomed = post(server, "doomed", headers={"x-conveyor-timeout-ms": "100"}, timeout=30)
        assert blocker.result().status_code == 200
    assert doomed.status_code == 504
    assert doomed.json()["error"]["code"] == "deadline_exceeded"
    # FIFO with batches of one: had "doomed" stayed queued, it would run before "after".
    assert post(server, "after", timeout=30).status_code == 200
    assert server.metric("conveyor_inputs_processed_total", model="slow") == 2
    assert server.metric("conveyor_requests_total", model="slow", outcome="deadline") == 1


def test_client_that_disconnects_is_dropped_before_running(server_factory) -> None:
    server: Server = server_factory(blocked_model())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        blocker = start_blocker(server, pool)
        with pytest.raises(httpx.ReadTimeout):
            post(server, "impatient", timeout=0.1)
        wait_for_metric(server, 1, "conveyor_requests_total", model="slow", outcome="client_gone")
        assert blocker.result().status_code == 200
    # FIFO with batches of one: had "impatient" stayed queued, it would run before "after".
    assert post(server, "after", timeout=30).status_code == 200
    assert server.metric("conveyor_inputs_processed_total", model="slow") == 2


def test_api_keys(server_factory) -> None:
    config = {**slow_model(batch_latency_ms=0), "api_keys": ["sk-test-0123456789"]}
    server: Server = server_factory(config)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.api, api_key="sk-wrong-key", max_retries=0).models.list()
    missing = httpx.get(f"{server.api}/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    good = openai.OpenAI(base_url=server.api, api_key="sk-test-0123456789", max_retries=0)
    assert [m.id for m in good.models.list()] == ["slow"]
    assert httpx.get(f"{server.url}/health").status_code == 200
