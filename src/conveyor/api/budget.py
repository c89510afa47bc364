"""Refuse a tenant's online requests once its monthly budget is spent (429 insufficient_quota).

The check reads the jobs subsystem's `MonthlyBudgets` (`app.state.jobs.budgets`), whose
cached month's cost makes it a dictionary lookup on nearly every request. It sits inside the
API key check (which names the tenant) and outside the rate limiter, so a refused request
spends no rate-limit tokens.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.api.errors import error_response
from conveyor.errors import InsufficientQuota
from conveyor.tenants.estimate import LIMITED_PATHS


class BudgetMiddleware:
    """429 `insufficient_quota` for model requests of a tenant over its monthly budget."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_model_call = scope["type"] == "http" and scope["method"] == "POST"
        if is_model_call and scope["path"] in LIMITED_PATHS:
            jobs = getattr(scope["app"].state, "jobs", None)
            tenant = scope.get("state", {}).get("tenant", "default")
            if jobs is not None:
                try:
                    await jobs.budgets.check(tenant)
                except InsufficientQuota as exc:
                    await error_response(exc)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
