"""Answering a generation call over HTTP: one JSON body, or server-sent events.

Both routes share this flow. Errors that happen before the first token (the deadline,
a model fault) still get a plain HTTP error status: a streamed response is only started
once the first output is in hand. After that, an error travels as an ``error`` event.
A caller who goes away, while waiting or while streaming, aborts the generation so its
KV-cache blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from conveyor.api.disconnect import DisconnectWatcher
from conveyor.api.embeddings import OUTCOME_BY_STATUS, timeout_from_headers
from conveyor.endpoints.generation import ChoiceResult, GenerationRun, PreparedRun
from conveyor.errors import ClientGone, ConveyorError
from conveyor.metrics import GeneratorMetrics
from conveyor.offload import run_sized
from conveyor.priority import Priority
from conveyor.service import Service

__all__ = ["DONE_EVENT", "encode_event", "respond"]

DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

MakeBody = Callable[[GenerationRun, Sequence[ChoiceResult]], dict[str, Any]]


def encode_event(payload: Mapping[str, Any]) -> bytes:
    """One ``data:`` event holding ``payload`` as JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def outcome_of(error: ConveyorError) -> str:
    """The ``requests_total`` outcome label for an error."""
    return OUTCOME_BY_STATUS.get(error.status_code, "model_error")


async def serve_generation(
    request: Request,
    parse: Callable[[bytes], Any],
    prepare: Callable[[Service, Any], PreparedRun],
    make_body: MakeBody,
    make_chunks: Callable[..., AsyncIterator[dict[str, Any]]],
) -> Response:
    """The whole HTTP flow of a generation endpoint: parse, admit, answer as JSON or SSE.

    Parsing and tokenizing a large body run off the event loop (``run_sized``).
    """
    service: Service = request.app.state.service
    started_s = time.perf_counter()
    raw = await request.body()
    timeout_ms = timeout_from_headers(request)
    body, prepared = await run_sized(len(raw), _parse_and_prepare, service, raw, parse, prepare)
    generator = service.generator(body.model)
    try:
        if isinstance(prepared, ConveyorError):
            raise prepared
        run = prepared.launch(priority=Priority.ONLINE, timeout_ms=timeout_ms)
    except ConveyorError as exc:
        generator.metrics.requests[outcome_of(exc)].inc()
        raise
    return await respond(
        request,
        run,
        generator.metrics,
        started_s=started_s,
        is_stream=body.stream,
        make_body=make_body,
        chunks=make_chunks(run, include_usage=body.include_usage),
    )


def _parse_and_prepare(
    service: Service,
    raw: bytes,
    parse: Callable[[bytes], Any],
    prepare: Callable[[Service, Any], PreparedRun],
) -> tuple[Any, PreparedRun | ConveyorError]:
    """Parse, then prepare; a preparation error is returned for the caller to count."""
    body = parse(raw)
    service.generator(body.model)  # 404 / 400 for the wrong model, uncounted as before
    try:
        return body, prepare(service, body)
    except ConveyorError as exc:
        return body, exc


async def respond(
    request: Request,
    run: GenerationRun,
    metrics: GeneratorMetrics,
    *,
    started_s: float,
    is_stream: bool,
    make_body: MakeBody,
    chunks: AsyncIterator[dict[str, Any]],
) -> Response:
    """Wait for the first output (stream) or the whole result (JSON), watching the caller."""
    watcher = DisconnectWatcher(request.receive, _canceller(asyncio.current_task()))
    try:
        if is_stream:
            await run.first()
        else:
            body = make_body(run, await run.collect())
    except asyncio.CancelledError:
        run.close()
        if not watcher.is_gone:
            raise
        metrics.requests["client_gone"].inc()
        raise ClientGone("the client disconnected before the result was ready") from None
    except ConveyorError as exc:
        run.close()
        metrics.requests[outcome_of(exc)].inc()
        raise
    finally:
        watcher.close()
    if not is_stream:
        run.close()
        metrics.requests["ok"].inc()
        metrics.latency_s.observe(time.perf_counter() - started_s)
        return Response(orjson.dumps(body), media_type="application/json")
    return StreamingResponse(
        _events(run, chunks, metrics, started_s),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        # Runs after the stream, also when the caller hung up mid-way: free the blocks.
        background=BackgroundTask(run.close),
    )


def _canceller(task: asyncio.Task[Any] | None) -> Callable[[], None]:
    """A callback that cancels ``task`` (the handler waiting for the result)."""

    def cancel() -> None:
        if task is not None:
            task.cancel()

    return cancel


async def _events(
    run: GenerationRun,
    chunks: AsyncIterator[dict[str, Any]],
    metrics: GeneratorMetrics,
    started_s: float,
) -> AsyncIterator[bytes]:
    """Each chunk as an event, then ``[DONE]``; an error mid-stream becomes an event."""
    try:
        async for chunk in chunks:
            yield encode_event(chunk)
    except ConveyorError as exc:
        run.close()
        metrics.requests[outcome_of(exc)].inc()
        yield encode_event(exc.to_body())
        yield DONE_EVENT
        return
    except BaseException:
        # Cancelled: the caller went away mid-stream.
        run.close()
        metrics.requests["client_gone"].inc()
        raise
    run.close()
    metrics.requests["ok"].inc()
    metrics.latency_s.observe(time.perf_counter() - started_s)
    yield DONE_EVENT
