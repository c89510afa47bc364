"""The layers every Conveyor app wears in front of its routes, in one place: the edge
(request ids, HTTP metrics, crash guard), CORS, API keys, the body cap, budgets, rate limits,
and around them all Anthropic's error shape on Anthropic's routes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from conveyor.api.anthropic_errors import AnthropicErrorShape
from conveyor.api.auth import ApiKeyMiddleware, static_principals
from conveyor.api.body_limit import UPLOAD_PATHS, BodyLimitMiddleware
from conveyor.api.budget import BudgetMiddleware, budget_refusals_counter
from conveyor.api.edge import Dispatch, Edge, EdgeApp, Shortcut
from conveyor.api.rate_limit import TicketIssuer
from conveyor.api.residency import Residency, ResidencyMiddleware
from conveyor.config.settings import ServerConfig
from conveyor.fleet.credential import FleetCredential
from conveyor.observability.metrics import TenantMetrics
from conveyor.observability.tracing import build_provider, tracer_of
from conveyor.stores.protocols import ApiKeyStore
from conveyor.tenants.config import RateLimitsConfig
from conveyor.tenants.gate import RateLimitGate
from conveyor.tenants.keyring import KeyRing
from conveyor.tenants.limiter import MemoryRateLimiter, RateLimiter

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


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


def build_limiter(config: RateLimitsConfig, metrics: TenantMetrics) -> RateLimiter:
    """The configured bucket backend (Redis imported only when used)."""
    if config.backend == "memory":
        return MemoryRateLimiter()
    from conveyor.tenants.limiter_redis import RedisRateLimiter
    from conveyor.tenants.limiter_shares import SharedRateLimiter

    remote = RedisRateLimiter(
        config.redis_url,
        prefix=config.redis_prefix,
        timeout_s=config.redis_timeout_s,
        on_lost_settlements=metrics.backend_errors.labels("settle").inc,
    )
    return SharedRateLimiter(remote) if config.local_shares else remote


def build_gate(config: ServerConfig, registry: CollectorRegistry | None) -> RateLimitGate | None:
    """The tenant rate-limit gate, or None when no tenant has an online limit."""
    tenancy = config.tenancy
    if not tenancy.has_online_limits:
        return None
    metrics = TenantMetrics(registry or CollectorRegistry())
    return RateLimitGate(tenancy, build_limiter(tenancy.rate_limits, metrics), metrics)


def install_middleware(
    app: EdgeApp,
    config: ServerConfig,
    *,
    counter: Any,
    shortcut: Shortcut | None = None,
    key_store: ApiKeyStore | None = None,
    owns_key_store: bool = False,
    registry: CollectorRegistry | None = None,
    with_rate_limits: bool = True,
    counts_tokens: bool = False,
    service_name: str = "conveyor-serve",
    tracer_provider: TracerProvider | None = None,
    fleet_credential: FleetCredential | None = None,
    residency: Residency | None = None,
) -> EdgeGuards:
    """Put the edge and the guards in front of ``app``'s own stack, outermost first: the
    edge (request ids, HTTP metrics on `counter`, crash guard), CORS when configured, API
    keys, the body cap, budgets, then `shortcut`'s direct routes.

    Keys are the config's plus, with `key_store`, the stored ones (read once now, then
    reread by the key ring the returned guards start and stop with the app). The rate-limit
    gate is built only when some tenant has an online limit (its metrics go to `registry`)
    and is no layer: with `counts_tokens` (`serve`) the edge issues each limited request a
    ticket that the app admits once the request is tokenized; otherwise (the gateway) the
    app applies the returned guards' gate itself (`gateway.limits`).
    Traces go to ``tracer_provider`` when given (tests), else to the config's OTLP endpoint.
    With `fleet_credential` (a fleet worker) the fleet key is accepted for the caller its
    gateway names, and a key is required even with none configured. With `residency` (a
    fleet worker with resident tenants) a tenant pinned elsewhere is refused (503).
    """
    keyring = KeyRing(
        static_principals(config.api_keys), key_store, owns_store=owns_key_store,
        requires_keys=fleet_credential is not None,
    )  # fmt: skip
    keyring.load()
    gate = build_gate(config, registry) if with_rate_limits else None
    guards = EdgeGuards(keyring, gate)
    app.state.guards = guards
    provider = tracer_provider or build_provider(config.tracing, service_name)
    has_budgets = with_rate_limits and bool(config.tenancy.budgets_usd)
    refusals = budget_refusals_counter(registry or CollectorRegistry()) if has_budgets else None

    def edge(full: ASGIApp) -> ASGIApp:
        inner = _guarded(full, config, keyring, shortcut, refusals, fleet_credential, residency)
        # Outermost, so a 401 or 413 carries a request id and is counted too.
        level = logging.INFO if config.log_format == "json" else logging.DEBUG
        issuer = TicketIssuer(gate) if gate is not None and counts_tokens else None
        guarded = Edge(inner, counter=counter, tracer=tracer_of(provider), log_level=level,
                       on_request=issuer)  # fmt: skip
        # Around the edge, so its own crash answer on Anthropic's paths is reshaped too.
        return AnthropicErrorShape(guarded)

    app.edge = edge
    return guards


def _guarded(
    full: ASGIApp,
    config: ServerConfig,
    keyring: KeyRing,
    shortcut: Shortcut | None,
    refusals: Counter | None,
    fleet_credential: FleetCredential | None,
    residency: Residency | None = None,
) -> ASGIApp:
    """``full`` behind the guards, innermost first: ``shortcut``'s direct routes, budgets
    (with ``refusals``), the body cap, residency, API keys, CORS when configured."""
    inner: ASGIApp = Dispatch(full, shortcut)
    if refusals is not None:  # outside the limiter: a refusal spends no tokens
        inner = BudgetMiddleware(inner, refusals=refusals)
    inner = BodyLimitMiddleware(
        inner, max_bytes=config.max_request_bytes, exempt_paths=UPLOAD_PATHS
    )
    if residency is not None and residency.tenant_regions:
        inner = ResidencyMiddleware(inner, residency)
    inner = ApiKeyMiddleware(
        inner, keyring=keyring, is_metrics_open=not config.metrics_auth, fleet=fleet_credential
    )
    if config.cors_origins:
        # Outside the key check, so a browser's preflight OPTIONS, which carries no
        # key, is answered, and error responses carry the CORS headers too.
        inner = CORSMiddleware(
            inner,
            allow_origins=config.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )
    return inner
