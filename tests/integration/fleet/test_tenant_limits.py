"""Tenant limits across real gateways sharing Redis: one rpm for the fleet, Redis outages.

Two gateways and a worker on a fresh PostgreSQL store, keys created in the store, buckets
in the local Redis under a prefix of this test's own (deleted afterwards). Redis is reached
through a TCP proxy the test controls, so it can be cut off and brought back.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from conveyor.stores import open_job_store
from conveyor.tenants.keys import new_key_record
from tests.integration.fleet.conftest import MODEL, Fleet, Proc
from tests.polling import until
from tests.redis_server import REDIS_HOST, REDIS_PORT
from tests.tcp_proxy import ProxyMode, TcpProxy

pytestmark = pytest.mark.postgres


def create_key(store_url: str, tenant: str) -> str:
    """A new key for `tenant` in the fleet's store."""
    key, record = new_key_record(tenant)
    store = open_job_store(store_url)
    try:
        store.create_api_key(record)
    finally:
        store.close()
    return key


def gateway_config(
    tmp: Path, name: str, redis_url: str, prefix: str, redis_timeout_s: float = 0.25, **limits: Any
) -> str:
    """A gateway YAML: tenant acme limited per minute, buckets in Redis."""
    config = {
        "tenants": [{"name": "acme", "limits": {"*": limits}}],
        "rate_limits": {
            "backend": "redis",
            "redis_url": redis_url,
            "redis_prefix": prefix,
            "redis_timeout_s": redis_timeout_s,
            "on_backend_error": "deny" if name.endswith("deny") else "allow",
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


async def burst(gateways: list[Proc], key: str, num_requests: int) -> list[httpx.Response]:
    """`num_requests` embeddings at once, alternating between the gateways."""
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=num_requests)
    async with httpx.AsyncClient(limits=limits, timeout=30, headers=headers) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    f"{gateways[i % 2].url}/v1/embeddings", json={"model": MODEL, "input": "x"}
                )
                for i in range(num_requests)
            )
        )
    return list(answers)


def test_a_burst_split_across_two_gateways_admits_the_rpm_once(
    fleet: Fleet, store_url: str, tmp_path: Path, redis_prefix: str
) -> None:
    key = create_key(store_url, "acme")
    redis_url = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"
    fleet.start_worker("w1")
    # Deny on a backend error, with a generous Redis timeout: on a busy machine a slow
    # Redis call must not be allowed through uncounted (that is the `allow` policy's job).
    gateways = [
        fleet.start_gateway(
            name,
            extra_args=(
                "--config",
                gateway_config(
                    tmp_path, name, redis_url, redis_prefix, redis_timeout_s=5.0, rpm=100
                ),
            ),
        )
        for name in ("g1-deny", "g2-deny")
    ]
    started_s = time.monotonic()
    answers = asyncio.run(burst(gateways, key, 300))
    # The buckets refill continuously (100 a minute): a burst that takes longer on a busy
    # machine may admit that refill too; a quick one admits exactly the limit, or one more.
    refill = int((time.monotonic() - started_s) * 100 / 60)
    outcomes = Counter(outcome(answer) for answer in answers)
    # The limiter's refusals are its own code; on a busy machine the worker may refuse some
    # of what the gateways admitted (its queue full): admitted all the same.
    assert set(outcomes) <= {"ok", "rate_limit_exceeded", "queue_full", "deadline_unreachable"}
    admitted = len(answers) - outcomes["rate_limit_exceeded"]
    assert 100 <= admitted <= 101 + refill, (outcomes, refill)
    refused = next(answer for answer in answers if outcome(answer) == "rate_limit_exceeded")
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "100"


def outcome(answer: httpx.Response) -> str:
    """An answer's outcome: ok for a 200, a 429's error code, or another status."""
    if answer.status_code == 200:
        return "ok"
    if answer.status_code != 429:
        return str(answer.status_code)
    return str(answer.json()["error"]["code"])


def post_until(
    gateway: Proc, key: str, wanted: int, timeout_s: float, *, without: str | None = None
) -> httpx.Response:
    """Post until the answer has status `wanted` (and no header `without`); fail after
    `timeout_s`."""

    seen: list[httpx.Response] = []

    def wanted_answer() -> httpx.Response | None:
        answer = httpx.post(
            f"{gateway.url}/v1/embeddings",
            json={"model": MODEL, "input": "x"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        is_wanted = answer.status_code == wanted and (
            without is None or without not in answer.headers
        )
        seen[:] = [answer]
        return answer if is_wanted else None

    def what() -> str:
        last = seen[-1] if seen else None
        shown = (last.status_code, last.headers, last.text) if last is not None else None
        return f"a {wanted} answer without {without}; last: {shown}"

    return until(wanted_answer, what, timeout_s=timeout_s)


def test_redis_outage_is_allowed_or_denied_as_configured_and_recovers(
    fleet: Fleet, store_url: str, tmp_path: Path, redis_prefix: str
) -> None:
    key = create_key(store_url, "acme")
    with TcpProxy(REDIS_HOST, REDIS_PORT) as proxy:
        redis_url = f"redis://127.0.0.1:{proxy.port}/0"
        fleet.start_worker("w1")
        allow, deny = (
            fleet.start_gateway(
                name,
                extra_args=(
                    "--config",
                    gateway_config(tmp_path, name, redis_url, redis_prefix, rpm=10_000),
                ),
            )
            for name in ("g-allow", "g-deny")
        )
        for gateway in (allow, deny):
            assert "x-ratelimit-remaining-requests" in post_until(gateway, key, 200, 10).headers
        for mode in (ProxyMode.REFUSE, ProxyMode.FREEZE):
            proxy.set_mode(mode)
            # A gateway first admits from the share of the bucket it still holds (counted
            # already, with headers); then `allow` admits uncounted (no headers).
            post_until(allow, key, 200, 10, without="x-ratelimit-limit-requests")
            denied = post_until(deny, key, 503, 10)
            assert denied.json()["error"]["code"] == "rate_limit_backend_unavailable"
            proxy.set_mode(ProxyMode.PASS)
            for gateway in (allow, deny):
                post_until(gateway, key, 200, 10)
        for gateway in (allow, deny):
            assert gateway.metric("conveyor_rate_limit_backend_errors_total") >= 2
