"""``POST /v1/responses``: run a response now (JSON or server-sent events), or queue it.

The flow is the chat route's (``api.sse``): parse, check the model, prepare off the loop,
admit against the tenant's limits on exact token counts, run at online priority, and
answer once the first output (stream) or the whole response (JSON) is in hand, so errors
before the first token are plain HTTP errors. A stored response (``store``, true by
default) is written before the last event goes out, so the next turn finds it. Events
are sent as OpenAI sends them: ``event: <type>`` and ``data: <json>``, no ``[DONE]``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from conveyor.api.rate_limit import admission_of
from conveyor.api.request_state import tenant_of
from conveyor.api.sse import SSE_HEADERS, encode_named
from conveyor.api.stored_responses import stored_of
from conveyor.asgi.disconnect import disconnect_cancels
from conveyor.asgi.json import json_response
from conveyor.asgi.timeouts import timeout_from_headers
from conveyor.endpoints.generation import GenerationRun
from conveyor.endpoints.responses.run import (
    OnEnd,
    PreparedResponse,
    collect_response,
    parse_response_request,
    prepare_response,
    stream_events,
)
from conveyor.endpoints.responses.stored import StoredResponses
from conveyor.errors import JobStoreUnavailable
from conveyor.host.offload import run_sized
from conveyor.host.service import Service
from conveyor.priority import Priority
from conveyor.response_ids import new_response_id
from conveyor.stores.errors import StoreError

log = logging.getLogger(__name__)

router = APIRouter()


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    """OpenAI's Responses API on the chat path; ``background: true`` queues a durable job."""
    service: Service = request.app.state.service
    raw = await request.body()
    body = await run_sized(len(raw), parse_response_request, raw)
    tenant = tenant_of(request)
    service.generator(body.model)  # 404 / 400 for the wrong model, before any store read
    stored = stored_of(request)
    context = await stored.context_of(tenant, body.previous_response_id)
    if body.background:
        return json_response(await stored.queue(tenant, body, context))
    response_id = new_response_id(body.previous_response_id)
    prepared = await prepare_response(service, body, context, response_id=response_id)
    payer = service.online_payer(tenant, admission_of(request))
    run = await prepared.start(
        service, priority=Priority.ONLINE, timeout_ms=timeout_from_headers(request), payer=payer
    )
    on_end = _saver(stored, tenant, prepared) if body.is_stored else None
    if body.stream:
        return await _stream(request, prepared, run, on_end)
    return await _whole(request, prepared, run, on_end)


def _saver(stored: StoredResponses, tenant: str, prepared: PreparedResponse) -> OnEnd:
    """Stores the finished response with its conversation; a store failure is a 503."""

    async def save(response: dict[str, Any]) -> None:
        try:
            await stored.save(tenant, response, prepared.items)
        except StoreError as exc:
            log.error("response %s could not be stored: %s", response["id"], exc)
            raise JobStoreUnavailable(
                "the response could not be stored; send the request again"
            ) from None

    return save


async def _whole(
    request: Request, prepared: PreparedResponse, run: GenerationRun, on_end: OnEnd | None
) -> Response:
    """The whole response as JSON, once stored; a caller who leaves aborts the run."""
    try:
        with disconnect_cancels(request.receive, request.scope):
            response = await collect_response(prepared, run)
    finally:
        run.close()
    if on_end is not None:
        await on_end(response)
    return json_response(response)


async def _stream(
    request: Request, prepared: PreparedResponse, run: GenerationRun, on_end: OnEnd | None
) -> Response:
    """Server-sent events, started once the first output is in hand."""
    try:
        with disconnect_cancels(request.receive, request.scope):
            await run.first()
    except BaseException:  # an error, the caller gone or a cancellation: nothing to wait for
        run.close()
        raise
    return StreamingResponse(
        _encoded(stream_events(prepared, run, on_end), run),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        background=BackgroundTask(run.close),  # also when the caller hung up mid-way
    )


async def _encoded(
    events: AsyncIterator[dict[str, Any]], run: GenerationRun
) -> AsyncIterator[bytes]:
    """Each event as bytes; the run is aborted when the caller goes away mid-stream."""
    try:
        async for event in events:
            yield encode_named(event)
    finally:
        run.close()
