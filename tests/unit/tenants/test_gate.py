"""Admission and settlement against configured limits, on the memory limiter and a fake clock."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from conveyor.errors import RateLimitBackendDown, RateLimited, TokensExceedLimit
from conveyor.observability.metrics import TenantMetrics
from conveyor.tenants.buckets import Decision
from conveyor.tenants.config import TenancyConfig
from conveyor.tenants.estimate import TokenAsk
from conveyor.tenants.gate import (
    RateLimitGate,
    Reservation,
    format_reset,
    rate_limit_headers,
    reservation_headers,
)
from conveyor.tenants.limiter import BucketAsk, LimiterUnavailable, MemoryRateLimiter

pytestmark = pytest.mark.anyio

TENANCY = {
    "tenants": [
        {
            "name": "acme",
            "limits": {
                "*": {"rpm": 2, "input_tpm": 600, "output_tpm": 120},
                "llama": {"output_tpm": 60},
            },
        }
    ],
    "default_tenant_limits": {"rpm": 1},
}


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def make_gate(tenancy: dict[str, object] = TENANCY) -> tuple[RateLimitGate, FakeClock]:
    clock = FakeClock()
    metrics = TenantMetrics(CollectorRegistry())
    config = TenancyConfig.model_validate(tenancy)
    return RateLimitGate(config, MemoryRateLimiter(), metrics, clock=clock), clock


def test_model_limits_override_the_star_entry_field_by_field() -> None:
    config = TenancyConfig.model_validate(TENANCY)
    llama = config.limits_for("acme", "llama")
    assert (llama.rpm, llama.input_tpm, llama.output_tpm) == (2, 600, 60)
    assert config.limits_for("acme", "other").output_tpm == 120
    assert config.limits_for("stranger", "llama").rpm == 1


async def test_rpm_refuses_with_429_naming_the_limit_and_a_retry_after() -> None:
    gate, clock = make_gate()
    for _ in range(2):
        await gate.admit("acme", TokenAsk("m", 10, 10))
    with pytest.raises(RateLimited) as refused:
        await gate.admit("acme", TokenAsk("m", 10, 10))
    assert refused.value.status_code == 429 and refused.value.code == "rate_limit_exceeded"
    assert "rpm 2" in refused.value.message and refused.value.error_type == "requests"
    assert refused.value.headers()["Retry-After"] == "30"
    assert refused.value.headers()["x-ratelimit-remaining-requests"] == "0"
    clock.now_s += 30
    await gate.admit("acme", TokenAsk("m", 10, 10))


async def test_a_request_that_can_never_fit_gets_400_at_once() -> None:
    gate, _ = make_gate()
    with pytest.raises(TokensExceedLimit) as too_big:
        await gate.admit("acme", TokenAsk("llama", 10, 61))
    assert too_big.value.status_code == 400 and "output_tpm limit is 60" in too_big.value.message


async def test_settlement_refunds_unused_output_and_charges_exact_input() -> None:
    gate, _ = make_gate()
    res = await gate.admit("acme", TokenAsk("m", 100, 100))
    assert res is not None
    gate.settle(res, input_tokens=150, output_tokens=30)  # 70 back, 50 more input
    nxt = await gate.admit("acme", TokenAsk("m", 0, 0))
    assert nxt is not None and nxt.decision is not None
    remaining = {v.name: v.remaining for v in nxt.decision.views}
    assert remaining == {"requests": 0, "input_tokens": 450, "output_tokens": 90}


async def test_output_tokens_refuse_with_the_tokens_kind() -> None:
    gate, clock = make_gate()
    await gate.admit("acme", TokenAsk("llama", 0, 60))
    clock.now_s += 31  # the requests bucket has refilled; the output one only half
    with pytest.raises(RateLimited) as refused:
        await gate.admit("acme", TokenAsk("llama", 0, 60))
    assert refused.value.error_type == "tokens" and "output_tpm 60" in refused.value.message
    assert refused.value.retry_after_s == 29


async def test_unlimited_tenants_pass_without_a_reservation() -> None:
    gate, _ = make_gate({"tenants": [{"name": "free"}]})
    assert await gate.admit("free", TokenAsk("m", 10**6, 10**6)) is None


class DownLimiter(MemoryRateLimiter):
    def take_now(self, key: str, asks: list[BucketAsk], now_s: float) -> Decision | None:  # type: ignore[override]
        return None

    async def take(self, key: str, asks: list[BucketAsk], now_s: float) -> Decision:  # type: ignore[override]
        raise LimiterUnavailable("down")


@pytest.mark.parametrize("policy", ["allow", "deny"])
async def test_an_unreachable_backend_allows_or_denies_and_is_counted(policy: str) -> None:
    config = TenancyConfig.model_validate({**TENANCY, "rate_limits": {"on_backend_error": policy}})
    registry = CollectorRegistry()
    gate = RateLimitGate(config, DownLimiter(), TenantMetrics(registry))
    if policy == "deny":
        with pytest.raises(RateLimitBackendDown):
            await gate.admit("acme", TokenAsk("m", 1, 1))
    else:
        res = await gate.admit("acme", TokenAsk("m", 1, 1))
        assert res is not None and res.decision is None
        gate.settle(res, 1, 0)  # never raises
    errors = registry.get_sample_value(
        "conveyor_rate_limit_backend_errors_total", {"operation": "admit"}
    )
    assert errors == 1


def test_headers_follow_openai_names_and_duration_style() -> None:
    decision = Decision(True, 0.0, (), ())
    assert rate_limit_headers(decision) == []
    assert [format_reset(s) for s in (0.25, 1.5, 6.0, 360.0)] == ["250ms", "1.5s", "6s", "6m0s"]


def test_headers_say_what_the_decision_s_views_say() -> None:
    asks = [("requests", 60, 1), ("input_tokens", 600, 500), ("output_tokens", 100, 10)]
    decision = Decision(True, 0.0, asks, [59.0, 99.5, -3.0])
    headers = {k.decode(): v.decode() for k, v in rate_limit_headers(decision)}
    views = {v.name: v for v in decision.views}
    assert headers["x-ratelimit-remaining-requests"] == str(views["requests"].remaining)
    assert headers["x-ratelimit-reset-requests"] == format_reset(views["requests"].reset_s)
    assert headers["x-ratelimit-remaining-input-tokens"] == str(views["input_tokens"].remaining)
    # The tokens triple shows the fuller-used bucket: output, in debt, shows 0 left.
    assert headers["x-ratelimit-limit-tokens"] == "100"
    assert headers["x-ratelimit-remaining-tokens"] == "0" == str(views["output_tokens"].remaining)
    assert headers["x-ratelimit-reset-tokens"] == format_reset(views["output_tokens"].reset_s)


def test_the_headers_of_a_decision_are_built_once_and_reset_waits_round_up() -> None:
    decision = Decision(True, 0.0, [("requests", 60, 1)], [30.0])
    limits = TenancyConfig.model_validate({}).limits_for("t", "m")
    shared = [Reservation("k", "t", "m", limits, 0, 0, decision) for _ in range(2)]
    first, second = (reservation_headers(res) for res in shared)
    assert first is second and dict(first)[b"x-ratelimit-reset-requests"] == b"30s"
    assert reservation_headers(None) == ()
    waits = (0.1, 0.0001, 1.2345, 59.9991, 119.2)  # float noise in 0.1 adds no ms
    assert [format_reset(s) for s in waits] == ["100ms", "1ms", "1.235s", "1m0s", "2m0s"]


class RemoteOnly(MemoryRateLimiter):
    """A limiter that never answers from memory: every admission waits for it."""

    def __init__(self) -> None:
        super().__init__()
        self.num_takes = 0

    def take_now(self, key: str, asks: list[BucketAsk], now_s: float) -> None:  # type: ignore[override]
        return None

    async def take(self, key: str, asks: list[BucketAsk], now_s: float) -> Decision:  # type: ignore[override]
        self.num_takes += 1
        return super().take_now(key, asks, now_s)


async def test_a_waiting_admission_asks_the_backend_once_and_still_refuses_the_impossible() -> None:
    limiter = RemoteOnly()
    gate = RateLimitGate(TenancyConfig.model_validate(TENANCY), limiter,
                         TenantMetrics(CollectorRegistry()))  # fmt: skip
    assert await gate.admit("acme", TokenAsk("llama", 10, 10)) is not None
    assert limiter.num_takes == 1
    with pytest.raises(TokensExceedLimit):  # 400 from the waiting half too, not a 429
        await gate.admit_waiting("acme", "llama", 10, 61)
    assert limiter.num_takes == 1
