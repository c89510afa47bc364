"""The rate-limit middleware: headers on answers, 429/400 before the app, settlement from usage."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter
from starlette.types import Receive, Scope, Send

from conveyor.api.edge import Edge
from conveyor.api.middleware import build_limiter
from conveyor.api.rate_limit import RateLimitMiddleware
from conveyor.metrics import TenantMetrics
from conveyor.tenants.config import RateLimitsConfig, TenancyConfig
from conveyor.tenants.gate import RateLimitGate
from conveyor.tenants.limiter import MemoryRateLimiter
from conveyor.tenants.limiter_redis import RedisRateLimiter
from conveyor.tenants.limiter_shares import SharedRateLimiter

pytestmark = pytest.mark.anyio

LIMITS = {"rpm": 3, "input_tpm": 1000, "output_tpm": 100}


def usage_app(completion_tokens: int) -> Callable[[Scope, Receive, Send], object]:
    """A chat endpoint that reads the body and answers with fixed usage."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        usage = {"prompt_tokens": 7, "completion_tokens": completion_tokens, "total_tokens": 0}
        answer = orjson.dumps({"object": "chat.completion", "usage": usage})
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return app


def client(completion_tokens: int = 5) -> httpx.AsyncClient:
    config = TenancyConfig.model_validate({"default_tenant_limits": LIMITS})
    gate = RateLimitGate(config, MemoryRateLimiter(), TenantMetrics(CollectorRegistry()))
    requests = Counter("requests", "HTTP requests", ["method", "route", "status"],
                       registry=CollectorRegistry())  # fmt: skip
    # Behind the edge, as every app installs it: the headers go through its hook.
    app = Edge(RateLimitMiddleware(usage_app(completion_tokens), gate), counter=requests)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def chat(max_tokens: int) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": "m", "messages": messages, "max_tokens": max_tokens}


async def test_headers_show_the_reservation_and_the_next_answer_the_refund() -> None:
    async with client(completion_tokens=5) as http:
        first = await http.post("/v1/chat/completions", json=chat(60))
        second = await http.post("/v1/chat/completions", json=chat(10))
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "3"
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-output-tokens"] == "40"  # 60 reserved
    assert first.headers["x-ratelimit-limit-tokens"] == "100"  # the output bucket is tighter
    # 55 of the 60 came back when the first answer reported 5 completion tokens.
    assert int(second.headers["x-ratelimit-remaining-output-tokens"]) in (85, 86)
    assert second.headers["x-ratelimit-reset-requests"].endswith("s")


async def test_over_the_limit_is_429_and_never_fitting_is_400() -> None:
    async with client() as http:
        too_big = await http.post("/v1/chat/completions", json=chat(101))
        for _ in range(3):
            assert (await http.post("/v1/chat/completions", json=chat(1))).status_code == 200
        refused = await http.post("/v1/chat/completions", json=chat(1))
    assert too_big.status_code == 400
    assert too_big.json()["error"]["code"] == "tokens_exceed_rate_limit"
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "rpm 3" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "20"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


async def test_other_routes_and_bad_bodies_pass_untouched() -> None:
    async with client() as http:
        other = await http.post("/v1/files", content=b"{}")
        bad = await http.post("/v1/chat/completions", content=b"not json")
    assert "x-ratelimit-limit-requests" not in other.headers
    assert "x-ratelimit-limit-requests" not in bad.headers


async def test_the_redis_backend_admits_through_local_shares_unless_turned_off() -> None:
    metrics = TenantMetrics(CollectorRegistry())
    shared = build_limiter(RateLimitsConfig(backend="redis"), metrics)
    plain = build_limiter(RateLimitsConfig(backend="redis", local_shares=False), metrics)
    assert isinstance(shared, SharedRateLimiter) and isinstance(shared.remote, RedisRateLimiter)
    assert isinstance(plain, RedisRateLimiter)
    assert isinstance(build_limiter(RateLimitsConfig(), metrics), MemoryRateLimiter)
    for limiter in (shared, plain):
        await limiter.close()


async def test_without_the_edge_in_front_it_fails_loudly_instead_of_dropping_headers() -> None:
    config = TenancyConfig.model_validate({"default_tenant_limits": LIMITS})
    gate = RateLimitGate(config, MemoryRateLimiter(), TenantMetrics(CollectorRegistry()))
    bare = RateLimitMiddleware(usage_app(5), gate)
    transport = httpx.ASGITransport(app=bare, raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        with pytest.raises(RuntimeError, match="behind the edge"):
            await http.post("/v1/chat/completions", json=chat(5))
