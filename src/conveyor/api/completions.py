"""``POST /v1/completions``: parse, submit, answer as JSON or server-sent events."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.api.embeddings import timeout_from_headers
from conveyor.api.sse import outcome_of, respond
from conveyor.errors import ConveyorError
from conveyor.priority import Priority
from conveyor.service import Service

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    """OpenAI text completions; one choice per prompt, ``stream: true`` for SSE."""
    # Imported here: generation pulls in torch, which a server without generative
    # models should never load (import time, and objects for the collector to track).
    from conveyor.endpoints.completions import (
        completion_body,
        completion_chunks,
        parse_completion_request,
        start_completion,
    )

    service: Service = request.app.state.service
    started_s = time.perf_counter()
    body = parse_completion_request(await request.body())
    generator = service.generator(body.model)
    try:
        run = start_completion(
            service, body, priority=Priority.ONLINE, timeout_ms=timeout_from_headers(request)
        )
    except ConveyorError as exc:
        generator.metrics.requests[outcome_of(exc)].inc()
        raise
    return await respond(
        request,
        run,
        generator.metrics,
        started_s=started_s,
        is_stream=body.stream,
        make_body=completion_body,
        chunks=completion_chunks(run, include_usage=body.include_usage),
    )
