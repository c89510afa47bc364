"""``POST /v1/completions``: parse, submit, answer as JSON or server-sent events."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.api.sse import serve_generation
from conveyor.endpoints.completions import (
    completion_body,
    completion_chunks,
    parse_completion_request,
    prepare_completion,
)

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    """OpenAI text completions; one choice per prompt, ``stream: true`` for SSE."""
    return await serve_generation(
        request, parse_completion_request, prepare_completion, completion_body, completion_chunks
    )
