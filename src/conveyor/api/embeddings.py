"""``POST /v1/embeddings``: parse, run with disconnect watching, answer."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import orjson
from fastapi import Request
from starlette.responses import Response

from conveyor.api.disconnect import DisconnectWatcher
from conveyor.endpoints.embeddings import parse_embedding_request, run_embeddings
from conveyor.errors import ClientGone, ConveyorError, InvalidRequest
from conveyor.offload import run_sized
from conveyor.service import Service

TIMEOUT_HEADER = "x-conveyor-timeout-ms"
OUTCOME_BY_STATUS = {
    400: "input_error",
    429: "rejected_queue_full",
    499: "client_gone",
    503: "unavailable",
    504: "deadline",
}


def timeout_from_headers(request: Request) -> float | None:
    """The caller's own deadline in ms, if sent."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a number of milliseconds") from None
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a positive, finite number of milliseconds")
    return value


def _canceller(task: asyncio.Task[object] | None) -> Callable[[], None]:
    def cancel() -> None:
        if task is not None:
            task.cancel()

    return cancel


async def create_embeddings(request: Request) -> Response:
    """Embed each input; several inputs are batched like separate requests."""
    service: Service = request.app.state.service
    started = time.perf_counter()
    raw = await request.body()
    body = await run_sized(len(raw), parse_embedding_request, raw)
    metrics = service.model_metrics(body.model)
    watcher = DisconnectWatcher(request.receive, _canceller(asyncio.current_task()))
    try:
        result = await run_embeddings(service, body, timeout_ms=timeout_from_headers(request))
    except asyncio.CancelledError:
        if not watcher.is_gone:
            raise
        metrics.requests["client_gone"].inc()
        raise ClientGone("the client disconnected before the result was ready") from None
    except ConveyorError as exc:
        metrics.requests[OUTCOME_BY_STATUS.get(exc.status_code, "model_error")].inc()
        raise
    finally:
        watcher.close()
    metrics.requests["ok"].inc()
    metrics.latency_s.observe(time.perf_counter() - started)
    return Response(orjson.dumps(result), media_type="application/json")
