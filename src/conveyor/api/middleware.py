"""The middleware every Conveyor app wears, in one place: API keys, the body cap, rate limits."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from conveyor.api.auth import ApiKeyMiddleware, static_principals
from conveyor.api.body_limit import UPLOAD_PATHS, BodyLimitMiddleware
from conveyor.api.rate_limit import RateLimitMiddleware
from conveyor.config import ServerConfig
from conveyor.metrics import TenantMetrics
from conveyor.stores.protocols import ApiKeyStore
from conveyor.tenants.config import RateLimitsConfig
from conveyor.tenants.gate import RateLimitGate
from conveyor.tenants.keyring import KeyRing
from conveyor.tenants.limiter import MemoryRateLimiter, RateLimiter


@dataclass(slots=True)
class EdgeGuards:
    """The parts of the middleware with a lifetime: the key ring and the rate-limit gate."""

    keyring: KeyRing
    gate: RateLimitGate | None

    async def start(self) -> None:
        """Start rereading keys."""
        await self.keyring.start()

    async def stop(self) -> None:
        """Stop rereading keys and close the limiter's connections."""
        await self.keyring.stop()
        if self.gate is not None:
            await self.gate.limiter.close()


def build_limiter(config: RateLimitsConfig) -> RateLimiter:
    """The configured bucket backend (Redis imported only when used)."""
    if config.backend == "memory":
        return MemoryRateLimiter()
    from conveyor.tenants.limiter_redis import RedisRateLimiter

    return RedisRateLimiter(
        config.redis_url, prefix=config.redis_prefix, timeout_s=config.redis_timeout_s
    )


def install_middleware(
    app: FastAPI,
    config: ServerConfig,
    *,
    key_store: ApiKeyStore | None = None,
    owns_key_store: bool = False,
    registry: CollectorRegistry | None = None,
    with_rate_limits: bool = True,
) -> EdgeGuards:
    """Add API keys (outermost), the body cap, then tenant rate limits (innermost).

    Keys are the config's plus, with `key_store`, the stored ones (read once now, then
    reread by the key ring the returned guards start and stop with the app). Rate limits
    are added only when some tenant has an online limit; their metrics go to `registry`.
    """
    keyring = KeyRing(static_principals(config.api_keys), key_store, owns_store=owns_key_store)
    keyring.load()
    gate = None
    tenancy = config.tenancy
    if with_rate_limits and tenancy.has_online_limits:
        metrics = TenantMetrics(registry or CollectorRegistry())
        gate = RateLimitGate(tenancy, build_limiter(tenancy.rate_limits), metrics)
        app.add_middleware(RateLimitMiddleware, gate=gate)
    guards = EdgeGuards(keyring, gate)
    app.state.guards = guards
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=config.max_request_bytes, exempt_paths=UPLOAD_PATHS
    )
    app.add_middleware(ApiKeyMiddleware, keyring=keyring, is_metrics_open=not config.metrics_auth)
    return guards
