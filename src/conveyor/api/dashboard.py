"""``GET /dashboard`` (a static page, no build step) and ``GET /v1/dashboard/state``.

The page and its scripts are open, like ``/health``: they hold no data. The state
document is behind the API keys like every ``/v1`` route; the page asks for a key when
the state answers 401 and keeps it for the browser tab only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, Response

from conveyor.api.request_state import is_admin, jobs_of, tenant_of
from conveyor.asgi.json import json_response
from conveyor.dashboard.metrics_read import MetricReader
from conveyor.dashboard.state import (
    USAGE_WINDOW_S,
    document,
    gateway_models,
    job_row,
    model_pulls,
    tenant_limits,
    tenant_usage,
    viewer,
)
from conveyor.errors import ConveyorError, NotFound

log = logging.getLogger(__name__)

router = APIRouter()

STATIC_DIR = Path(__file__).resolve().parent.parent / "dashboard" / "static"
# The only files served, and their types: nothing else under the folder is reachable.
STATIC_FILES = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "vendor/uPlot.iife.min.js": "text/javascript",
}
NO_CACHE = {"Cache-Control": "no-cache"}
JOBS_SHOWN = 20


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> Response:
    """The dashboard page."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=NO_CACHE)


@router.get("/dashboard/{name:path}", include_in_schema=False)
async def dashboard_file(name: str) -> Response:
    """The page's scripts and styles."""
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        raise NotFound(f"no dashboard file {name!r}")
    return FileResponse(STATIC_DIR / name, media_type=media_type, headers=NO_CACHE)


@router.get("/v1/dashboard/state")
async def dashboard_state(request: Request) -> Response:
    """Models, fleet and batch jobs as the dashboard shows them (docs/operations/dashboard.md)."""
    state = request.app.state
    tenant = tenant_of(request)
    guards = getattr(state, "guards", None)
    who = viewer(tenant, guards is not None and guards.keyring.is_enforced)
    jobs = await _jobs(request, tenant)
    only = None if who["scope"] == "all" or is_admin(request) else tenant
    usage = await _usage(request, only)
    limits = _limits(request, only)
    gateway = getattr(state, "gateway", None)
    if gateway is not None:
        from conveyor.gateway.status import fleet_document

        fleet = fleet_document(gateway)
        models = gateway_models(gateway)
        return json_response(document("gateway", who, models, jobs, fleet, usage, limits))
    from conveyor.dashboard.serve_state import service_models

    service = state.service
    models = service_models(service)
    pulls = model_pulls(MetricReader(service.metrics.registry), time.time())
    return json_response(document("serve", who, models, jobs, None, usage, limits, pulls))


def _limits(request: Request, only: str | None) -> list[dict[str, Any]]:
    """429s per tenant by limit (rate limits and monthly budgets), and budgets against cost."""
    state = request.app.state
    gate = getattr(getattr(state, "guards", None), "gate", None)
    refusals: list[tuple[str, str, float]] = []
    if gate is not None:
        for family in gate.metrics.rate_limited.collect():
            refusals += [
                (s.labels["tenant"], s.labels["limit"], s.value)
                for s in family.samples
                if s.name.endswith("_total")
            ]
    jobs = getattr(state, "jobs", None)
    budgets = getattr(jobs, "budgets", None)
    if budgets is None:
        return tenant_limits(refusals, {}, {}, only)
    known = {t: (usd, budgets.known_cost_usd(t)) for t, usd in budgets.budgets_usd.items()}
    return tenant_limits(refusals, budgets.num_refused, known, only)


async def _usage(request: Request, tenant: str | None) -> list[dict[str, Any]] | None:
    """The last hour's usage per tenant (``tenant`` only, unless None); None if unreadable."""
    since_s = int(time.time()) - USAGE_WINDOW_S
    try:
        store = jobs_of(request).context.store.blocking
        rows = await asyncio.to_thread(store.list_usage, since_s, None, tenant)
    except ConveyorError as exc:
        log.warning("dashboard: usage unavailable: %s", exc)
        return None
    return tenant_usage(rows)


async def _jobs(request: Request, tenant: str) -> list[dict[str, Any]] | None:
    """The viewer's newest batch jobs; None when the job store cannot be read now."""
    try:
        rows, _ = await jobs_of(request).api.list_batches(tenant, after=None, limit=JOBS_SHOWN)
    except ConveyorError as exc:
        log.warning("dashboard: batch jobs unavailable: %s", exc)
        return None
    return [job_row(row) for row in rows]
