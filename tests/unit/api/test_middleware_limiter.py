"""Which limiter a rate-limits config builds (shared by `serve` and the gateway)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from conveyor.api.middleware import build_limiter
from conveyor.observability.metrics import TenantMetrics
from conveyor.tenants.config import RateLimitsConfig
from conveyor.tenants.limiter import MemoryRateLimiter
from conveyor.tenants.limiter_redis import RedisRateLimiter
from conveyor.tenants.limiter_shares import SharedRateLimiter

pytestmark = pytest.mark.anyio


async def test_the_redis_backend_admits_through_local_shares_unless_turned_off() -> None:
    metrics = TenantMetrics(CollectorRegistry())
    shared = build_limiter(RateLimitsConfig(backend="redis"), metrics)
    plain = build_limiter(RateLimitsConfig(backend="redis", local_shares=False), metrics)
    assert isinstance(shared, SharedRateLimiter) and isinstance(shared.remote, RedisRateLimiter)
    assert isinstance(plain, RedisRateLimiter)
    assert isinstance(build_limiter(RateLimitsConfig(), metrics), MemoryRateLimiter)
    for limiter in (shared, plain):
        await limiter.close()
