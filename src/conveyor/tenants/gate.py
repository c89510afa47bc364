"""Admission against a tenant's limits: reserve at the start, settle at the end.

Per tenant and model there are up to three buckets: requests (`rpm`), input tokens
(`input_tpm`) and output tokens (`output_tpm`). A request that asks one bucket for more
than it can ever hold gets 400 at once; one that must wait gets 429 with `Retry-After`.
When the backend cannot be reached, `on_backend_error` decides (allow or deny, never 500).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from conveyor.errors import RateLimitBackendDown, RateLimited, TokensExceedLimit
from conveyor.metrics import TenantMetrics
from conveyor.tenants.buckets import Decision, remaining_at, seconds_until
from conveyor.tenants.config import ModelLimits, TenancyConfig
from conveyor.tenants.estimate import TokenAsk
from conveyor.tenants.limiter import BucketAsk, LimiterUnavailable, RateLimiter

log = logging.getLogger(__name__)

REQUESTS, INPUT, OUTPUT = "requests", "input_tokens", "output_tokens"
_LIMIT_NAMES = {REQUESTS: "rpm", INPUT: "input_tpm", OUTPUT: "output_tpm"}
MAX_KEPT_LIMITS = 10_000  # (tenant, model) pairs whose limits are kept worked out


class MustWait:
    """`admit_at_once`'s answer when the limiter must be awaited."""


MUST_WAIT = MustWait()


@dataclass(slots=True)
class Reservation:
    """What an admitted request took, to be settled when it ends."""

    key: str
    tenant: str
    model: str
    limits: ModelLimits
    input_tokens: int
    output_tokens: int
    decision: Decision | None  # None: admitted without the backend (allow on error)


def bucket_asks(limits: ModelLimits, input_tokens: int, output_tokens: int) -> list[BucketAsk]:
    """The buckets a request takes from: only those its limits define."""
    asks: list[BucketAsk] = []
    if limits.rpm is not None:
        asks.append((REQUESTS, limits.rpm, 1))
    if limits.input_tpm is not None:
        asks.append((INPUT, limits.input_tpm, input_tokens))
    if limits.output_tpm is not None:
        asks.append((OUTPUT, limits.output_tpm, output_tokens))
    return asks


def check_fits(asks: list[BucketAsk]) -> None:
    """400 for a request no bucket could ever hold (waiting would never help)."""
    for name, capacity, amount in asks:
        if amount > capacity:
            raise TokensExceedLimit(
                f"this request needs {amount} {name.replace('_', ' ')} but the "
                f"{_LIMIT_NAMES[name]} limit is {capacity}; it can never be admitted",
                param="max_tokens" if name == OUTPUT else None,
            )


def refusal(decision: Decision) -> RateLimited:
    """The 429 for a refused admission, naming the limit."""
    name = decision.refused_by or REQUESTS
    limit = next(cap for bucket, cap, _ in decision.asks if bucket == name)
    wait_s = max(1, math.ceil(decision.retry_after_s))
    return RateLimited(
        f"rate limit reached: {_LIMIT_NAMES[name]} {limit}; retry in {wait_s} s",
        kind="requests" if name == REQUESTS else "tokens",
        retry_after_s=wait_s,
        extra_headers={k.decode(): v.decode() for k, v in rate_limit_headers(decision)},
    )


class RateLimitGate:
    """Admits and settles requests against the configured limits on one limiter."""

    def __init__(
        self,
        tenancy: TenancyConfig,
        limiter: RateLimiter,
        metrics: TenantMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` is unix seconds (shared by every gateway on the Redis backend)."""
        self.tenancy = tenancy
        self.limiter = limiter
        self.metrics = metrics
        self._clock = clock
        self._on_error: Literal["allow", "deny"] = tenancy.rate_limits.on_backend_error
        self._limits: dict[tuple[str, str], tuple[ModelLimits, str]] = {}

    def _limits_of(self, tenant: str, model: str) -> tuple[ModelLimits, str]:
        """The tenant's limits on `model` and its bucket key, worked out once and kept."""
        found = self._limits.get((tenant, model))
        if found is None:
            if len(self._limits) >= MAX_KEPT_LIMITS:  # unknown model names must not pile up
                self._limits.clear()
            found = (self.tenancy.limits_for(tenant, model), f"{tenant}\x1f{model}")
            self._limits[(tenant, model)] = found
        return found

    async def admit(self, tenant: str, ask: TokenAsk) -> Reservation | None:
        """Reserve the request's buckets (None: no limit applies). Raises 400, 429 or 503."""
        return await self.admit_tokens(tenant, ask.model, ask.input_tokens, ask.output_tokens)

    def admit_at_once(
        self, tenant: str, model: str, input_tokens: int, output_tokens: int
    ) -> Reservation | MustWait | None:
        """`admit_tokens` without waiting, when the limiter can answer from memory (a local
        share, the memory backend); `MUST_WAIT` when it cannot. Raises as `admit`."""
        limits, key = self._limits_of(tenant, model)
        asks = bucket_asks(limits, input_tokens, output_tokens)
        if not asks:
            return None
        check_fits(asks)
        decision = self.limiter.take_now(key, asks, self._clock())
        if decision is None:
            return MUST_WAIT
        return self._reserved(decision, key, tenant, model, limits, input_tokens, output_tokens)

    async def admit_tokens(
        self, tenant: str, model: str, input_tokens: int, output_tokens: int
    ) -> Reservation | None:
        """`admit` without building a `TokenAsk` (the per-request path on `serve`)."""
        found = self.admit_at_once(tenant, model, input_tokens, output_tokens)
        if not isinstance(found, MustWait):
            return found
        limits, key = self._limits_of(tenant, model)
        asks = bucket_asks(limits, input_tokens, output_tokens)
        try:
            decision: Decision | None = await self.limiter.take(key, asks, self._clock())
        except LimiterUnavailable:
            self.metrics.backend_errors.labels("admit").inc()
            log.warning("rate limit backend unreachable; %s", self._on_error)
            if self._on_error == "deny":
                raise RateLimitBackendDown("the rate limit backend is unavailable") from None
            decision = None
        return self._reserved(decision, key, tenant, model, limits, input_tokens, output_tokens)

    def _reserved(
        self,
        decision: Decision | None,
        key: str,
        tenant: str,
        model: str,
        limits: ModelLimits,
        input_tokens: int,
        output_tokens: int,
    ) -> Reservation:
        """The reservation of an admitted request (None: allowed past a down backend), or
        the 429 of a refused one."""
        if decision is not None and not decision.is_admitted:
            error = refusal(decision)
            limit = _LIMIT_NAMES[decision.refused_by or REQUESTS]
            self.metrics.rate_limited.labels(tenant, model, limit).inc()
            raise error
        return Reservation(key, tenant, model, limits, input_tokens, output_tokens, decision)

    def settle(self, res: Reservation, input_tokens: int, output_tokens: int) -> None:
        """Refund what was reserved but not used (or charge what was under-estimated).

        Never waits: the limiter applies it now or sends it with its next call.
        """
        input_delta = res.input_tokens - input_tokens
        output_delta = res.output_tokens - output_tokens
        if input_delta == 0 and output_delta == 0:  # exact (as on `serve` for embeddings)
            return
        now_s = self._clock()
        deltas = (
            (INPUT, res.limits.input_tpm, input_delta),
            (OUTPUT, res.limits.output_tpm, output_delta),
        )
        for name, capacity, delta in deltas:
            if capacity is not None and delta != 0:
                self.limiter.settle(res.key, name, capacity, delta, now_s)


def format_reset(seconds: float) -> str:
    """A wait in OpenAI's header style: `250ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest):d}s"


_EXTRA_NAMES = {INPUT: b"x-ratelimit-remaining-input-tokens",
                OUTPUT: b"x-ratelimit-remaining-output-tokens"}  # fmt: skip


def rate_limit_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    """OpenAI's `x-ratelimit-*` headers; the tokens ones show the fuller-used token bucket.

    Worked out from the decision's levels in one pass (the same figures as its `views`,
    without building them): every limited answer carries these.
    """
    headers: list[tuple[bytes, bytes]] = []
    extras: list[tuple[bytes, bytes]] = []
    tight_fraction, tight_cap, tight_level = 2.0, 0, 0.0
    for (name, cap, _), level in zip(decision.asks, decision.levels, strict=True):
        if name == REQUESTS:
            headers += _triple(_REQUEST_NAMES, cap, level)
        else:
            left = remaining_at(level)
            extras.append((_EXTRA_NAMES[name], b"%d" % left))  # both kinds, beyond OpenAI's
            if left / cap < tight_fraction:
                tight_fraction, tight_cap, tight_level = left / cap, cap, level
    if extras:
        headers += _triple(_TOKEN_NAMES, tight_cap, tight_level)
        headers += extras
    return headers


def reservation_headers(res: Reservation | None) -> list[tuple[bytes, bytes]]:
    """The headers of an answer admitted with `res` (none without one or its decision)."""
    if res is None or res.decision is None:
        return []
    return rate_limit_headers(res.decision)


_REQUEST_NAMES = (b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests",
                  b"x-ratelimit-reset-requests")  # fmt: skip
_TOKEN_NAMES = (b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens",
                b"x-ratelimit-reset-tokens")  # fmt: skip


def _triple(
    names: tuple[bytes, bytes, bytes], cap: int, level: float
) -> tuple[tuple[bytes, bytes], ...]:
    reset_s = seconds_until(level, cap, cap)
    reset = b"%dms" % math.ceil(reset_s * 1000) if reset_s < 1 else format_reset(reset_s).encode()
    return ((names[0], b"%d" % cap), (names[1], b"%d" % remaining_at(level)), (names[2], reset))
