"""Answering a generation call over HTTP: one JSON body, or server-sent events.

Both routes share this flow. Errors that happen before the first token (the deadline,
a model fault) still get a plain HTTP error status: a streamed response is only started
once the first output is in hand. After that, an error travels as an ``error`` event.
A caller who goes away, while waiting or while streaming, aborts the generation so its
KV-cache blocks are freed at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from conveyor.api.rate_limit import admission_of
from conveyor.api.request_state import tenant_of
from conveyor.asgi.disconnect import disconnect_cancels
from conveyor.asgi.json import raw_json_response
from conveyor.asgi.timeouts import timeout_from_headers
from conveyor.endpoints.answers import encode_body
from conveyor.endpoints.generation import ChoiceResult, GenerationRun, PreparedRun
from conveyor.endpoints.off_loop import prepare_off_loop
from conveyor.errors import ConveyorError
from conveyor.host.offload import run_sized
from conveyor.host.service import Service
from conveyor.priority import Priority

__all__ = [
    "DONE_EVENT",
    "OPENAI_EVENTS",
    "EventFormat",
    "encode_event",
    "encode_named",
    "respond",
]

DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

MakeBody = Callable[[GenerationRun, Sequence[ChoiceResult]], dict[str, Any]]


def encode_event(payload: Mapping[str, Any]) -> bytes:
    """One ``data:`` event holding ``payload`` as JSON."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def encode_named(payload: Mapping[str, Any]) -> bytes:
    """One event named by its payload's ``type``, with the payload as its data (Anthropic's
    and OpenAI's Responses streams: ``event: <type>``, no ``[DONE]``)."""
    name = str(payload["type"]).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _openai_error(error: ConveyorError) -> list[bytes]:
    """An error mid-stream, as OpenAI sends it: its error body, then ``[DONE]``."""
    return [encode_event(error.to_body()), DONE_EVENT]


@dataclass(frozen=True, slots=True)
class EventFormat:
    """How a stream's events are written: each chunk, the end, and an error mid-stream."""

    encode: Callable[[Mapping[str, Any]], bytes] = encode_event
    end: bytes = DONE_EVENT
    error: Callable[[ConveyorError], Sequence[bytes]] = _openai_error


OPENAI_EVENTS = EventFormat()


async def serve_generation(
    request: Request,
    parse: Callable[[bytes], Any],
    prepare: Callable[[Service, Any], PreparedRun],
    make_body: MakeBody,
    make_chunks: Callable[..., AsyncIterator[dict[str, Any]]],
    *,
    event_format: EventFormat = OPENAI_EVENTS,
) -> Response:
    """The whole HTTP flow of a generation endpoint: parse, admit, answer as JSON or SSE.

    Parsing a large body, tokenizing a large input and checking a grammar run off the
    event loop (``run_sized``, ``prepare_off_loop``). Outcome metrics are the run's own
    business (shared with batch lines), not counted here.
    """
    service: Service = request.app.state.service
    raw = await request.body()
    timeout_ms = timeout_from_headers(request)
    body = await run_sized(len(raw), parse, raw)
    prepared = await prepare_off_loop(service, prepare, body)  # the model resolved once, here
    payer = service.online_payer(tenant_of(request), admission_of(request))
    run = await prepared.start(
        service, priority=Priority.ONLINE, timeout_ms=timeout_ms, payer=payer
    )
    return await respond(
        request,
        run,
        is_stream=body.stream,
        make_body=make_body,
        chunks=make_chunks(run, include_usage=body.include_usage),
        event_format=event_format,
    )


async def respond(
    request: Request,
    run: GenerationRun,
    *,
    is_stream: bool,
    make_body: MakeBody,
    chunks: AsyncIterator[dict[str, Any]],
    event_format: EventFormat = OPENAI_EVENTS,
) -> Response:
    """Wait for the first output (stream) or the whole result (JSON), watching the caller."""
    try:
        with disconnect_cancels(request.receive, request.scope):
            if is_stream:
                await run.first()
            else:
                results = await run.collect()
    except BaseException:  # an error, the caller gone or a cancellation: nothing to wait for
        run.close()
        raise
    if not is_stream:
        run.close()
        return raw_json_response(await encode_body(make_body, run, results))
    return StreamingResponse(
        _events(run, chunks, event_format),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        # Runs after the stream, also when the caller hung up mid-way: free the blocks.
        background=BackgroundTask(run.close),
    )


async def _events(
    run: GenerationRun, chunks: AsyncIterator[dict[str, Any]], event_format: EventFormat
) -> AsyncIterator[bytes]:
    """Each chunk as an event, then the end (``[DONE]``); an error mid-stream becomes an
    event."""
    try:
        async for chunk in chunks:
            yield event_format.encode(chunk)
    except ConveyorError as exc:
        run.close()
        for event in event_format.error(exc):
            yield event
        return
    except BaseException:
        run.close()  # cancelled: the caller went away mid-stream
        raise
    run.close()
    if event_format.end:
        yield event_format.end
