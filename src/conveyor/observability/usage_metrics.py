"""What tenants used, as Prometheus counters: tokens, model-seconds and cost."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class UsageMetrics:
    """What tenants used: tokens, model-seconds and cost, by tenant and model."""

    def __init__(self, registry: CollectorRegistry) -> None:
        reg = registry
        self.tokens = Counter(
            "conveyor_tokens", "Tokens used, by kind (input, output)",
            ["tenant", "model", "kind"], registry=reg,
        )  # fmt: skip
        # `conveyor_model_seconds` is already the per-batch histogram, hence `usage_`.
        self.model_s = Counter(
            "conveyor_usage_model_seconds", "Model time used (each batch's time split by tokens)",
            ["tenant", "model"], registry=reg,
        )  # fmt: skip
        self.cost_usd = Counter(
            "conveyor_cost_usd", "Cost of the model time used, in US dollars",
            ["tenant", "model"], registry=reg,
        )  # fmt: skip

    def count(
        self, tenant: str, model: str, input_tokens: int, output_tokens: int, model_s: float,
        cost_usd: float,
    ) -> None:  # fmt: skip
        """Add one request's usage."""
        self.tokens.labels(tenant, model, "input").inc(input_tokens)
        self.tokens.labels(tenant, model, "output").inc(output_tokens)
        self.model_s.labels(tenant, model).inc(model_s)
        self.cost_usd.labels(tenant, model).inc(cost_usd)
