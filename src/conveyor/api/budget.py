"""Refuse a tenant's online requests once its monthly budget is spent (429 insufficient_quota).

The check reads the jobs subsystem's `MonthlyBudgets` (`app.state.jobs.budgets`), whose
cached month's cost makes it a dictionary lookup on nearly every request. It sits inside the
API key check (which names the tenant) and outside the rate limiter, so a refused request
spends no rate-limit tokens.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.asgi.json import error_response
from conveyor.errors import InsufficientQuota
from conveyor.tenants.estimate import LIMITED_PATHS


def budget_refusals_counter(registry: CollectorRegistry) -> Counter:
    """`conveyor_budget_refusals_total{tenant}`, registered in `registry`."""
    return Counter(
        "conveyor_budget_refusals_total",
        "Requests refused (429 insufficient_quota) because the tenant's monthly budget is spent",
        ["tenant"],
        registry=registry,
    )


class BudgetMiddleware:
    """429 `insufficient_quota` for model requests of a tenant over its monthly budget."""

    def __init__(self, app: ASGIApp, *, refusals: Counter | None = None) -> None:
        """`refusals` counts the refused requests by tenant (when given)."""
        self.app = app
        self.refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_model_call = scope["type"] == "http" and scope["method"] == "POST"
        if is_model_call and scope["path"] in LIMITED_PATHS:
            jobs = getattr(scope["app"].state, "jobs", None)
            tenant = scope.get("state", {}).get("tenant", "default")
            if jobs is not None:
                try:
                    await jobs.budgets.check(tenant)
                except InsufficientQuota as exc:
                    if self.refusals is not None:
                        self.refusals.labels(tenant).inc()
                    await error_response(exc)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
