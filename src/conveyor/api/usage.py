"""`GET /v1/usage`: the usage ledger as OpenAI's organization usage page, per tenant.

A tenant sees only its own usage; an admin key sees every tenant's and may group by tenant.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.api.request_state import int_param, is_admin, jobs_of, tenant_of
from conveyor.asgi.json import json_response
from conveyor.errors import InvalidRequest
from conveyor.tenants.usage_report import MAX_UNIX_S, parse_query, usage_page

router = APIRouter()


@router.get("/v1/usage")
async def get_usage(request: Request) -> Response:
    """Usage buckets (`start_time`, `end_time`, `bucket_width`, `group_by`, `limit`, `page`)."""
    admin = is_admin(request)
    group_by = [g for raw in request.query_params.getlist("group_by") for g in raw.split(",")]
    if "tenant" in group_by and not admin:
        raise InvalidRequest("only an admin key may group usage by tenant", param="group_by")
    page = int_param(request, "page")
    if page is not None and not 0 <= page <= MAX_UNIX_S:  # a page is the next bucket's start
        raise InvalidRequest("page must be a cursor this API returned (unix seconds)", param="page")
    query = parse_query(
        page if page is not None else int_param(request, "start_time"),
        int_param(request, "end_time"),
        request.query_params.get("bucket_width"),
        group_by,
        int_param(request, "limit"),
        now_s=int(time.time()),
    )
    tenant = None if admin else tenant_of(request)
    store = jobs_of(request).context.store.blocking
    rows = await asyncio.to_thread(store.list_usage, query.start_s, query.end_s, tenant)
    return json_response(usage_page(query, rows))
