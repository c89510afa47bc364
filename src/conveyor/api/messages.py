"""Anthropic's Messages routes: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

Thin, as the OpenAI routes are: the generation flow is ``api.sse``'s, with Anthropic's
named server-sent events (``event: <type>``, no ``[DONE]``). Errors on these paths leave
in Anthropic's shape (``api.anthropic_errors``); an error mid-stream is an ``error`` event.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from conveyor.anthropic_errors import anthropic_error
from conveyor.api.sse import EventFormat, encode_named, serve_generation
from conveyor.asgi.json import json_response
from conveyor.endpoints.messages.events import message_events
from conveyor.endpoints.messages.reply import message_body
from conveyor.endpoints.messages.run import count_tokens, parse_messages_request, prepare_messages
from conveyor.errors import ConveyorError

router = APIRouter()


def error_events(error: ConveyorError) -> list[bytes]:
    """An error mid-stream: Anthropic's ``error`` event (the stream ends with it)."""
    return [encode_named(anthropic_error(error.status_code, error.message))]


ANTHROPIC_EVENTS = EventFormat(encode=encode_named, end=b"", error=error_events)


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    """Anthropic's Messages API through the model's chat template; ``stream: true`` for SSE."""
    return await serve_generation(
        request, parse_messages_request, prepare_messages, message_body, message_events,
        event_format=ANTHROPIC_EVENTS,
    )  # fmt: skip


@router.post("/v1/messages/count_tokens")
async def count_message_tokens(request: Request) -> Response:
    """How many input tokens a Messages request's prompt is (``{"input_tokens": n}``)."""
    return json_response(await count_tokens(request.app.state.service, await request.body()))
