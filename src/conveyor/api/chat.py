"""``POST /v1/chat/completions``: parse, template, submit, answer as JSON or SSE."""

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


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    """OpenAI chat completions through the model's chat template; ``stream: true`` for SSE."""
    # Imported here: generation pulls in torch (see api/completions.py).
    from conveyor.endpoints.chat import chat_body, chat_chunks, parse_chat_request, start_chat

    service: Service = request.app.state.service
    started_s = time.perf_counter()
    body = parse_chat_request(await request.body())
    generator = service.generator(body.model)
    try:
        run = start_chat(
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
        make_body=chat_body,
        chunks=chat_chunks(run, include_usage=body.include_usage),
    )
