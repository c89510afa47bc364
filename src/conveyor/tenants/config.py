"""Tenant settings in the YAML: weights, budgets, per-model limits, the limiter's backend."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ANY_MODEL = "*"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelLimits(_Strict):
    """Per-minute allowances for one tenant on one model (None: unlimited)."""

    rpm: int | None = Field(default=None, ge=1, description="Requests a minute.")
    input_tpm: int | None = Field(default=None, ge=1, description="Input tokens a minute.")
    output_tpm: int | None = Field(
        default=None, ge=1, description="Output tokens a minute (reserved, unused part refunded)."
    )
    batch_queue_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Input tokens the tenant's active batches on the model may hold; a batch "
        "past it fails validation (token_limit_exceeded).",
    )

    def over(self, base: ModelLimits) -> ModelLimits:
        """These limits, with `base`'s where these leave one unset."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        merged = {k: v if v is not None else getattr(base, k) for k, v in fields.items()}
        return ModelLimits(**merged)

    @property
    def is_unlimited(self) -> bool:
        """No online limit at all (the batch queue bound is not an online limit)."""
        return self.rpm is None and self.input_tpm is None and self.output_tpm is None


NO_LIMITS = ModelLimits()


class TenantConfig(_Strict):
    """One tenant: its share of batch capacity, monthly budget and per-model limits."""

    name: str = Field(min_length=1, description="The tenant API keys name.")
    weight: float = Field(default=1.0, gt=0, description="Share of batch capacity (fair share).")
    budget_usd: float | None = Field(
        default=None, ge=0, description="Budget a UTC calendar month; reached: 429. Unset: none."
    )
    limits: dict[str, ModelLimits] = Field(
        default_factory=dict, description='Limits by model name; "*" applies to every model.'
    )
    regions: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Residency: only workers in these regions serve its requests and batch "
        "lines (none up: 503, never another region); its batch files stay in the first "
        "one's object store. Unset: any region.",
    )


class RateLimitsConfig(_Strict):
    """Where the token buckets live and what happens when that place is unreachable."""

    backend: Literal["memory", "redis"] = Field(
        default="memory", description="memory: this process's own; redis: shared by a fleet."
    )
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="The Redis server.")
    redis_prefix: str = Field(
        default="conveyor:rl:", min_length=1, description="Prefix of the buckets' Redis keys."
    )
    redis_timeout_s: float = Field(
        default=0.25, gt=0, le=10, description="An admission waits at most twice this for Redis."
    )
    on_backend_error: Literal["allow", "deny"] = Field(
        default="allow", description="While Redis cannot be reached: admit, or refuse with 503."
    )
    local_shares: bool = Field(
        default=True,
        description="Redis backend: a busy process draws small shares of a bucket and "
        "admits from them in memory (never above the limit; see tenants.limiter_shares).",
    )
    default_max_output_tokens: int = Field(
        default=4096,
        ge=1,
        description="Output tokens reserved for a request without max_tokens.",
    )


class PricingConfig(_Strict):
    """What a GPU hour costs (a model may set its own `gpu_hour_usd`)."""

    gpu_hour_usd: float = Field(default=2.5, ge=0, description="Default price of a GPU hour.")
    models: dict[str, float] = Field(default_factory=dict, description="gpu_hour_usd by model.")


class TenancyConfig(_Strict):
    """Every tenant setting together, as `ServerConfig` holds them."""

    tenants: list[TenantConfig] = Field(default_factory=list)
    default_tenant_limits: ModelLimits | None = None
    rate_limits: RateLimitsConfig = Field(default_factory=RateLimitsConfig)
    pricing: PricingConfig = Field(default_factory=PricingConfig)
    fair_share_half_life_s: float = Field(default=3600.0, gt=0)

    @model_validator(mode="after")
    def _unique_names(self) -> TenancyConfig:
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        return self

    def tenant(self, name: str) -> TenantConfig | None:
        """The tenant's entry, if listed."""
        return next((t for t in self.tenants if t.name == name), None)

    def limits_for(self, tenant: str, model: str) -> ModelLimits:
        """The tenant's limits on `model`: its entry for the model over its `*` entry.

        A tenant not listed gets `default_tenant_limits` (unlimited when unset).
        """
        entry = self.tenant(tenant)
        if entry is None:
            return self.default_tenant_limits or NO_LIMITS
        star = entry.limits.get(ANY_MODEL, NO_LIMITS)
        own = entry.limits.get(model)
        return own.over(star) if own is not None else star

    def batch_queue_tokens(self, tenant: str, model: str) -> int | None:
        """The input tokens the tenant's active batches on `model` may hold (None: any)."""
        return self.limits_for(tenant, model).batch_queue_tokens

    @property
    def regions(self) -> dict[str, tuple[str, ...]]:
        """The regions each resident tenant is pinned to, in its order (the first holds its
        batch files); unpinned tenants are absent."""
        return {t.name: tuple(dict.fromkeys(t.regions)) for t in self.tenants if t.regions}

    @property
    def weights(self) -> dict[str, float]:
        """Each listed tenant's share weight of batch capacity (others weigh 1)."""
        return {t.name: t.weight for t in self.tenants}

    @property
    def budgets_usd(self) -> dict[str, float]:
        """Each budgeted tenant's monthly budget."""
        return {t.name: t.budget_usd for t in self.tenants if t.budget_usd is not None}

    @property
    def has_online_limits(self) -> bool:
        """Whether any request could be limited (else the limiter stays out of the way)."""
        entries = [lim for t in self.tenants for lim in t.limits.values()]
        entries += [self.default_tenant_limits] if self.default_tenant_limits else []
        return any(not lim.is_unlimited for lim in entries)
