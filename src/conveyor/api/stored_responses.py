"""Stored responses over HTTP: retrieve, list input items, delete, cancel.

Served by ``serve``, a fleet worker and a gateway alike, from the job store (a fleet's is
shared), for the caller's tenant only. Creating a response is ``api.responses_api``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.api.request_state import int_param, jobs_of, tenant_of
from conveyor.asgi.json import json_response
from conveyor.endpoints.responses.stored import StoredResponses

router = APIRouter()


def stored_of(request: Request) -> StoredResponses:
    """The stored responses of the app's job store; a queued one wakes this process's
    background runner, where there is one (``app.state.background``)."""
    runner = getattr(request.app.state, "background", None)
    store = jobs_of(request).context.store.blocking
    return StoredResponses(store, wake_runner=runner.wake if runner is not None else None)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(request: Request, response_id: str) -> Response:
    """One stored response (a background one as far as it got)."""
    return json_response(await stored_of(request).get(tenant_of(request), response_id))


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(request: Request, response_id: str) -> Response:
    """The conversation's input items up to this response, newest first (``after``,
    ``limit``, ``order``)."""
    page = await stored_of(request).input_items(
        tenant_of(request),
        response_id,
        after=request.query_params.get("after"),
        limit=int_param(request, "limit"),
        order=request.query_params.get("order"),
    )
    return json_response(page)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    """Delete a stored response (a running background one stops)."""
    return json_response(await stored_of(request).delete(tenant_of(request), response_id))


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> Response:
    """Cancel a queued or running background response."""
    return json_response(await stored_of(request).cancel(tenant_of(request), response_id))
