"""`/v1/batches`: create, retrieve, list and cancel batch jobs."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.api.request_state import int_param, jobs_of, tenant_of
from conveyor.asgi.json import json_response
from conveyor.errors import InvalidRequest
from conveyor.jobs.views import batch_object, list_page

router = APIRouter()


@router.post("/v1/batches")
async def create_batch(request: Request) -> Response:
    """Start a batch over an uploaded file (`input_file_id`, `endpoint`, `completion_window`)."""
    try:
        params = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise InvalidRequest("the request body must be a JSON object")
    record = await jobs_of(request).api.create_batch(tenant_of(request), params)
    return json_response(batch_object(record))


@router.get("/v1/batches")
async def list_batches(request: Request) -> Response:
    """The caller's batches, newest first (`after`, `limit`, `order`)."""
    rows, has_more = await jobs_of(request).api.list_batches(
        tenant_of(request),
        after=request.query_params.get("after"),
        limit=int_param(request, "limit"),
        order=request.query_params.get("order"),
    )
    return json_response(list_page([batch_object(r) for r in rows], has_more))


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(request: Request, batch_id: str) -> Response:
    """One batch, with live request counts."""
    record = await jobs_of(request).api.get_batch(tenant_of(request), batch_id)
    return json_response(batch_object(record))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> Response:
    """Cancel a batch: what finished is kept, the rest is reported as cancelled."""
    record = await jobs_of(request).api.cancel_batch(tenant_of(request), batch_id)
    return json_response(batch_object(record))
