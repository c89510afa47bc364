"""``POST /v1/embeddings``: parse, run with disconnect watching, answer."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import Request
from starlette.responses import Response

from conveyor.api.disconnect import DisconnectWatcher, cancel_current_task
from conveyor.api.timeouts import timeout_from_headers
from conveyor.endpoints.embeddings import parse_embedding_request, run_embeddings
from conveyor.errors import ClientGone
from conveyor.offload import run_sized
from conveyor.service import Service


async def create_embeddings(request: Request) -> Response:
    """Embed each input; several inputs are batched like separate requests."""
    service: Service = request.app.state.service
    raw = await request.body()
    body = await run_sized(len(raw), parse_embedding_request, raw)
    timeout_ms = timeout_from_headers(request)
    watcher = DisconnectWatcher(request.receive, cancel_current_task())
    try:
        result = await run_embeddings(service, body, timeout_ms=timeout_ms)
    except asyncio.CancelledError:
        if not watcher.is_gone:
            raise
        raise ClientGone("the client disconnected before the result was ready") from None
    finally:
        watcher.close()
    return Response(orjson.dumps(result), media_type="application/json")
