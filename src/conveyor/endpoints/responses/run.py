"""Preparing and running one response on the chat path: whole, streamed, or as a batch line.

A response runs as the chat request its body maps to (``items``): the chat path's
template, tool calls, constrained decoding and engine. ``truncation: auto`` drops the
oldest messages after the instructions until the prompt and ``max_output_tokens`` fit;
``disabled`` (the default) answers a conversation that does not fit with a 400.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.endpoints.chat import prepare_chat
from conveyor.endpoints.chat_schemas import ChatCompletionRequest
from conveyor.endpoints.generation import GenerationRun, PreparedRun, prepare_counted
from conveyor.endpoints.responses.events import ResponseBuilder
from conveyor.endpoints.responses.input import input_items, items_chars
from conveyor.endpoints.responses.items import chat_messages, chat_request
from conveyor.endpoints.responses.output import envelope, error_object, usage_object
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.outputs import FinishReason, TokenLogprobs
from conveyor.errors import ConveyorError, InvalidRequest
from conveyor.host.offload import LARGE_INPUT_BYTES, run_sized
from conveyor.host.service import Service
from conveyor.priority import Priority
from conveyor.response_ids import new_response_id
from conveyor.tenants.usage import Payer

__all__ = [
    "PreparedResponse",
    "collect_response",
    "parse_response_request",
    "prepare_response",
    "run_response",
    "stream_events",
]

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
# The chat path's names for what the Responses body calls otherwise.
_PARAMS = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "top_logprobs": "top_logprobs",
}

OnEnd = Callable[[dict[str, Any]], Awaitable[None]]


def parse_response_request(body: bytes | str | dict[str, Any]) -> ResponseRequest:
    """Validate a Responses body; any mistake is a 400 naming the field."""
    return parse_body(ResponseRequest, body)


@dataclass(frozen=True, slots=True)
class PreparedResponse:
    """A response checked against its model and tokenized, ready to launch.

    ``items`` is the conversation's input (earlier turns, then this request's input), as
    stored and listed; ``base`` the Response object's envelope.
    """

    request: ResponseRequest
    chat: PreparedRun
    base: dict[str, Any]
    items: list[dict[str, Any]]

    @property
    def id(self) -> str:
        """The response's id."""
        return str(self.base["id"])

    async def start(
        self, service: Service, *, priority: Priority, timeout_ms: float | None, payer: Payer | None
    ) -> GenerationRun:
        """Admit and submit to the engine (429 / 400 raised here); the run bills ``payer`` at
        its end."""
        return await self.chat.start(service, priority=priority, timeout_ms=timeout_ms, payer=payer)


async def prepare_response(
    service: Service,
    request: ResponseRequest,
    context: Sequence[dict[str, Any]] = (),
    *,
    response_id: str | None = None,
) -> PreparedResponse:
    """Check and tokenize ``request`` continuing ``context``; as chat's, a large input is
    prepared on the large-input pool and a grammar checked on a worker thread."""
    service.generator(request.model)  # 404 / 400 for the wrong model, before any work
    num_bytes = request.input_bytes() + items_chars(context)
    if request.has_grammar and num_bytes < LARGE_INPUT_BYTES:
        items, chat = await asyncio.to_thread(_prepare_all, service, request, context)
    else:
        items, chat = await run_sized(num_bytes, _prepare_all, service, request, context)
    base = envelope(request, response_id or new_response_id(), int(time.time()))
    return PreparedResponse(request, chat, base, items)


def _prepare_all(
    service: Service, request: ResponseRequest, context: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], PreparedRun]:
    """The conversation's items and its chat run (blocking: tokenizes)."""
    items = [*context, *input_items(request)]
    prepare = functools.partial(_prepare_fitting, request=request, items=items)
    return items, prepare_counted(service, prepare, chat_request(request, items))


def _prepare_fitting(
    service: Service,
    chat: ChatCompletionRequest,
    *,
    request: ResponseRequest,
    items: list[dict[str, Any]],
) -> PreparedRun:
    """The chat run of the conversation, its oldest messages dropped to fit under ``auto``."""
    try:
        return prepare_chat(service, chat)
    except InvalidRequest as exc:
        if request.truncation != "auto" or exc.code != CONTEXT_LENGTH_EXCEEDED:
            raise _renamed(exc) from None
        first_error = exc
    # Fewest dropped messages that fit, by bisection; the last message is always kept.
    low, high = 1, len(chat_messages(None, items)) - 1
    best: PreparedRun | None = None
    while low <= high:
        middle = (low + high) // 2
        try:
            best = prepare_chat(service, chat_request(request, items, num_dropped=middle))
            high = middle - 1
        except InvalidRequest as exc:
            if exc.code != CONTEXT_LENGTH_EXCEEDED:
                raise _renamed(exc) from None
            low = middle + 1
    if best is None:
        raise _renamed(first_error) from None
    return best


def _renamed(exc: InvalidRequest) -> InvalidRequest:
    """The chat path's error in the Responses body's words."""
    message = exc.message
    for chat_name, name in _PARAMS.items():
        message = message.replace(chat_name, name)
    param = _PARAMS.get(exc.param or "", exc.param)
    return InvalidRequest(message, param=param, code=exc.code)


async def stream_events(
    prepared: PreparedResponse, run: GenerationRun, on_end: OnEnd | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Every stream event, ``response.created`` to the end; an error mid-run ends the
    stream with ``response.failed``. ``on_end`` gets the finished response before the
    last event is sent (to store it, so the next turn finds it)."""
    builder = ResponseBuilder(prepared.base, prepared.chat.tool_names)
    for event in builder.start():
        yield event
    try:
        async for event in _output_events(builder, run):
            if event["type"] in ("response.completed", "response.incomplete") and on_end:
                await on_end(builder.response)
            yield event
    except ConveyorError as exc:
        usage = usage_object(run.total_prompt_tokens, run.total_output_tokens)
        for event in builder.fail(error_object(exc), usage):
            yield event


async def collect_response(prepared: PreparedResponse, run: GenerationRun) -> dict[str, Any]:
    """The whole Response object (errors before the end are raised, not reported in it)."""
    builder = ResponseBuilder(prepared.base, prepared.chat.tool_names)
    async for _ in _output_events(builder, run):
        pass
    return builder.response


async def _output_events(
    builder: ResponseBuilder, run: GenerationRun
) -> AsyncIterator[dict[str, Any]]:
    """The events of the run's output, up to and including the closing event."""
    async for output in run.outputs():
        for event in builder.feed(output.text, logprob_entries(run.generator, output.logprobs)):
            yield event
        if output.finish_reason is not None:
            usage = usage_object(run.total_prompt_tokens, run.total_output_tokens)
            is_cut = output.finish_reason is FinishReason.LENGTH
            for event in builder.finish(is_cut=is_cut, usage=usage, now=int(time.time())):
                yield event


def logprob_entries(
    generator: HostedGenerator, logprobs: Sequence[TokenLogprobs]
) -> list[dict[str, Any]]:
    """An ``output_text`` part's logprobs: each token with its bytes and alternatives."""
    piece = generator.tokenizer.token_piece
    return [
        {
            "token": piece(item.token_id)[0],
            "bytes": list(piece(item.token_id)[1]),
            "logprob": item.logprob,
            "top_logprobs": [
                {"token": piece(token)[0], "bytes": list(piece(token)[1]), "logprob": value}
                for token, value in item.top
            ],
        }
        for item in logprobs
    ]


async def run_response(
    service: Service,
    body: bytes | str | dict[str, Any] | ResponseRequest,
    *,
    priority: Priority = Priority.BATCH,
    timeout_ms: float | None = None,
    payer: Payer | None = None,
) -> dict[str, Any]:
    """Run a self-contained body whole (batch lines, background runs): nothing is read
    from or written to the stored responses, so the body carries its whole conversation."""
    request = body if isinstance(body, ResponseRequest) else parse_response_request(body)
    if request.stream:
        raise InvalidRequest("stream: true is not supported here", param="stream")
    if request.previous_response_id is not None or request.background:
        raise InvalidRequest(
            "here a response is run on its own: send the whole conversation as input, without "
            "previous_response_id or background",
            param="previous_response_id" if request.previous_response_id else "background",
        )
    prepared = await prepare_response(service, request)
    run = await prepared.start(service, priority=priority, timeout_ms=timeout_ms, payer=payer)
    try:
        return await collect_response(prepared, run)
    finally:
        run.close()
