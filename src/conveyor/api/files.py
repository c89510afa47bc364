"""`/v1/files`: upload (streamed), list, retrieve, download and delete batch files."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import iterate_in_threadpool
from starlette.responses import Response, StreamingResponse

from conveyor.api.multipart import MultipartStream
from conveyor.api.request_state import int_param, jobs_of, tenant_of
from conveyor.asgi.json import json_response
from conveyor.jobs.views import deleted_file_object, file_object, list_page

router = APIRouter()


@router.post("/v1/files")
async def upload_file(request: Request) -> Response:
    """Multipart upload (`file`, `purpose=batch`), streamed to the object store."""
    api = jobs_of(request).api
    form = MultipartStream(request.headers.get("content-type", ""), api.check_upload_fields)
    chunks = form.file_chunks(request.stream())
    record = await api.upload_file(tenant_of(request), chunks, form)
    return json_response(file_object(record))


@router.get("/v1/files")
async def list_files(request: Request) -> Response:
    """The caller's files, newest first (`purpose`, `after`, `limit`, `order`)."""
    params = request.query_params
    rows, has_more = await jobs_of(request).api.list_files(
        tenant_of(request),
        purpose=params.get("purpose"),
        after=params.get("after"),
        limit=int_param(request, "limit"),
        order=params.get("order"),
    )
    return json_response(list_page([file_object(r) for r in rows], has_more))


@router.get("/v1/files/{file_id}")
async def retrieve_file(request: Request, file_id: str) -> Response:
    """One file's metadata."""
    record = await jobs_of(request).api.get_file(tenant_of(request), file_id)
    return json_response(file_object(record))


@router.get("/v1/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> Response:
    """The file's bytes, streamed from the object store."""
    record, chunks = await jobs_of(request).api.file_content(tenant_of(request), file_id)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="application/octet-stream",
        headers={"content-length": str(record.bytes)},
    )


@router.delete("/v1/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> Response:
    """Delete the file (404 if it is not the caller's)."""
    await jobs_of(request).api.delete_file(tenant_of(request), file_id)
    return json_response(deleted_file_object(file_id))
