"""``/v1/messages/batches``: Anthropic's Message Batches (create, retrieve, list, cancel,
results, delete) on the Batch API's job store; errors leave in Anthropic's shape
(``api.anthropic_errors``).

The create body may be far larger than other requests (256 MB, Anthropic's bound): its path
is exempt from the general body cap and counted against its own here.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import iterate_in_threadpool
from starlette.responses import Response, StreamingResponse

from conveyor.api.request_state import int_param, jobs_of, tenant_of
from conveyor.asgi.json import json_response
from conveyor.errors import RequestTooLarge
from conveyor.jobs.message_batch_input import MAX_MESSAGE_BATCH_BYTES
from conveyor.jobs.message_batch_views import message_batch_object, public_id

router = APIRouter()

BATCHES_PATH = "/v1/messages/batches"
JSONL = "application/x-jsonl"


async def read_capped(request: Request, max_bytes: int) -> bytes:
    """The whole body; 413 as soon as it passes ``max_bytes``."""
    chunks: list[bytes] = []
    num_bytes = 0
    async for chunk in request.stream():
        num_bytes += len(chunk)
        if num_bytes > max_bytes:
            raise RequestTooLarge(f"a message batch body is limited to {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(BATCHES_PATH)
async def create_message_batch(request: Request) -> Response:
    """Create a batch from inline ``requests`` (``custom_id`` and Messages ``params`` each)."""
    body = await read_capped(request, MAX_MESSAGE_BATCH_BYTES)
    record = await jobs_of(request).message_batches.create(tenant_of(request), body)
    return json_response(message_batch_object(record))


@router.get(BATCHES_PATH)
async def list_message_batches(request: Request) -> Response:
    """The caller's message batches, newest first (``limit``, ``after_id``, ``before_id``)."""
    query = request.query_params
    rows, has_more = await jobs_of(request).message_batches.list_page(
        tenant_of(request), limit=int_param(request, "limit"),
        after_id=query.get("after_id"), before_id=query.get("before_id"),
    )  # fmt: skip
    data = [message_batch_object(row) for row in rows]
    return json_response({
        "data": data, "has_more": has_more,
        "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
    })  # fmt: skip


@router.get(BATCHES_PATH + "/{message_batch_id}")
async def retrieve_message_batch(request: Request, message_batch_id: str) -> Response:
    """One message batch; ``results_url`` is set once it has ended."""
    record = await jobs_of(request).message_batches.get(tenant_of(request), message_batch_id)
    return json_response(message_batch_object(record))


@router.post(BATCHES_PATH + "/{message_batch_id}/cancel")
async def cancel_message_batch(request: Request, message_batch_id: str) -> Response:
    """Cancel: finished requests keep their results, the others end as ``canceled``."""
    batches = jobs_of(request).message_batches
    record = await batches.cancel(tenant_of(request), message_batch_id)
    return json_response(message_batch_object(record))


@router.delete(BATCHES_PATH + "/{message_batch_id}")
async def delete_message_batch(request: Request, message_batch_id: str) -> Response:
    """Delete an ended batch with its results."""
    batch_id = await jobs_of(request).message_batches.delete(tenant_of(request), message_batch_id)
    return json_response({"id": public_id(batch_id), "type": "message_batch_deleted"})


@router.get(BATCHES_PATH + "/{message_batch_id}/results")
async def message_batch_results(request: Request, message_batch_id: str) -> Response:
    """The results as JSONL, one ``{"custom_id", "result"}`` per request (any order)."""
    batches = jobs_of(request).message_batches
    lines = await batches.results(tenant_of(request), message_batch_id)
    return StreamingResponse(iterate_in_threadpool(lines), media_type=JSONL)
