"""A fleet worker's own residency check, behind the gateways' routing.

Gateways send a tenant pinned to regions (``tenants[].regions``) only to workers in them
(``fleet.regions``). A worker checks again: a model call (a POST to a path with a model,
as the budget and rate limits count them) of a tenant pinned to regions this worker is
not in is refused with 503 ``tenant_not_resident_here``, whether it came straight to the
worker or through a gateway whose config lacks the pin; that gateway then tries another
worker. It sits inside the API key check, which names the tenant.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.asgi.json import error_response
from conveyor.errors import ServiceUnavailable
from conveyor.fleet.regions import may_serve
from conveyor.tenants.estimate import LIMITED_PATHS

NOT_RESIDENT_CODE = "tenant_not_resident_here"


@dataclass(frozen=True, slots=True)
class Residency:
    """A worker's region (None: unlabelled) and the regions each resident tenant is pinned to."""

    region: str | None
    tenant_regions: Mapping[str, Collection[str]]


class ResidencyMiddleware:
    """503 ``tenant_not_resident_here`` for a model call of a tenant pinned elsewhere."""

    def __init__(self, app: ASGIApp, residency: Residency) -> None:
        """Refuse on behalf of ``residency``; everything else passes to ``app``."""
        self.app = app
        self.residency = residency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_model_call = scope["type"] == "http" and scope["method"] == "POST"
        if is_model_call and scope["path"] in LIMITED_PATHS:
            tenant = scope.get("state", {}).get("tenant", "default")
            pinned = self.residency.tenant_regions.get(tenant)
            here = self.residency.region
            if not may_serve(pinned, here):
                error = ServiceUnavailable(
                    f"tenant {tenant!r} is pinned to regions {sorted(pinned or ())}; this "
                    f"worker is in {here or 'no region'}", code=NOT_RESIDENT_CODE,
                )  # fmt: skip
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
