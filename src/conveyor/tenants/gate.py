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
from conveyor.observability.metrics import TenantMetrics
from conveyor.tenants.buckets import REFILL_WINDOW_S, Decision
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
        found = self.admit_at_once(tenant, ask.model, ask.input_tokens, ask.output_tokens)
        if isinstance(found, MustWait):
            return await self.admit_waiting(tenant, ask.model, ask.input_tokens, ask.output_tokens)
        return found

    def admit_at_once(
        self, tenant: str, model: str, input_tokens: int, output_tokens: int
    ) -> Reservation | MustWait | None:
        """`admit` without waiting, when the limiter can answer from memory (a local share,
        the memory backend); `MUST_WAIT` when it cannot (then: `admit_waiting`)."""
        limits, key = self._limits_of(tenant, model)
        asks = bucket_asks(limits, input_tokens, output_tokens)
        if not asks:
            return None
        decision = self.limiter.take_now(key, asks, self._clock())
        if decision is not None and decision.is_admitted:  # an admitted ask fits its buckets
            return Reservation(key, tenant, model, limits, input_tokens, output_tokens, decision)
        check_fits(asks)
        if decision is None:
            return MUST_WAIT
        return self._reserved(decision, key, tenant, model, limits, input_tokens, output_tokens)

    async def admit_waiting(
        self, tenant: str, model: str, input_tokens: int, output_tokens: int
    ) -> Reservation | None:
        """`admit`'s waiting half: ask the limiter's backend (after `admit_at_once` said
        `MUST_WAIT`; memory is not tried again). Raises as `admit`."""
        limits, key = self._limits_of(tenant, model)
        asks = bucket_asks(limits, input_tokens, output_tokens)
        if not asks:
            return None
        check_fits(asks)
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
    """A wait in OpenAI's header style, rounded up to the millisecond: `250ms`, `1.5s`,
    `6m0s`."""
    return reset_value(math.ceil(seconds * 1000 - 1e-6)).decode()


def reset_value(ms: int) -> bytes:
    """`format_reset` of `ms` whole milliseconds, as header bytes (integer formatting only:
    every limited answer carries two of these)."""
    if ms < 1000:
        return b"%dms" % max(0, ms)
    if ms < 60_000:
        whole, frac = divmod(ms, 1000)
        return b"%d.%ss" % (whole, (b"%03d" % frac).rstrip(b"0")) if frac else b"%ds" % whole
    minutes, rest_s = divmod(-(-ms // 1000), 60)
    return b"%dm%ds" % (minutes, rest_s)


_EXTRA_NAMES = {INPUT: b"x-ratelimit-remaining-input-tokens",
                OUTPUT: b"x-ratelimit-remaining-output-tokens"}  # fmt: skip
_LIMIT_REQUESTS, _REMAINING_REQUESTS, _RESET_REQUESTS = (
    b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests",
    b"x-ratelimit-reset-requests")  # fmt: skip
_LIMIT_TOKENS, _REMAINING_TOKENS, _RESET_TOKENS = (
    b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens",
    b"x-ratelimit-reset-tokens")  # fmt: skip
_MS_PER_WINDOW = 1000 * REFILL_WINDOW_S


def rate_limit_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    """OpenAI's `x-ratelimit-*` headers; the tokens ones show the fuller-used token bucket.

    Every limited answer carries these, so this is the hot path's own flat copy of
    `buckets.remaining_at` and `buckets.seconds_until` (a full bucket's wait) worked out
    from the decision's levels; `Decision.views` is the reference it is tested against.
    """
    headers: list[tuple[bytes, bytes]] = []
    tight_cap, tight_left, tight_level = 0, 0, 0.0
    for (name, cap, _), level in zip(decision.asks, decision.levels):  # noqa: B905
        left = int(level) if level > 0 else 0  # floor; a debt shows as 0
        if name == REQUESTS:
            reset_ms = math.ceil((cap - level) * _MS_PER_WINDOW / cap - 1e-6)
            headers += ((_LIMIT_REQUESTS, b"%d" % cap), (_REMAINING_REQUESTS, b"%d" % left),
                        (_RESET_REQUESTS, reset_value(reset_ms)))  # fmt: skip
        else:
            headers.append((_EXTRA_NAMES[name], b"%d" % left))  # both kinds, beyond OpenAI's
            if not tight_cap or left * tight_cap < tight_left * cap:  # a smaller fraction left
                tight_cap, tight_left, tight_level = cap, left, level
    if tight_cap:
        reset_ms = math.ceil((tight_cap - tight_level) * _MS_PER_WINDOW / tight_cap - 1e-6)
        headers += ((_LIMIT_TOKENS, b"%d" % tight_cap), (_REMAINING_TOKENS, b"%d" % tight_left),
                    (_RESET_TOKENS, reset_value(reset_ms)))  # fmt: skip
    return headers


def reservation_headers(res: Reservation | None) -> tuple[tuple[bytes, bytes], ...]:
    """The headers of an answer admitted with `res` (none without one or its decision),
    built once per decision."""
    if res is None or res.decision is None:
        return ()
    decision = res.decision
    if decision.headers is None:
        decision.headers = tuple(rate_limit_headers(decision))
    return decision.headers
