"""``/v1/messages`` and ``/v1/messages/count_tokens`` on the chat path.

A request is converted to a chat request (``convert``) and prepared as one; a prefill (a
final assistant turn) is tokenized after the chat template's prompt for the reply, so the
model continues that text. HTTP routes and batch lines share ``prepare_messages``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from conveyor.endpoints.chat import encode_chat, prepare_chat
from conveyor.endpoints.generation import PreparedRun, resolve_max_tokens
from conveyor.endpoints.messages.convert import to_chat
from conveyor.endpoints.messages.schemas import CountTokensRequest, MessagesRequest
from conveyor.endpoints.validation import parse_body
from conveyor.engine.generator import HostedGenerator
from conveyor.host.offload import run_sized
from conveyor.host.service import Service

__all__ = [
    "count_tokens",
    "parse_count_tokens_request",
    "parse_messages_request",
    "prepare_messages",
]

ID_PREFIX = "msg"


def parse_messages_request(body: bytes | str | dict[str, Any]) -> MessagesRequest:
    """Validate a Messages body; any mistake is a 400 naming the field."""
    return parse_body(MessagesRequest, body)


def parse_count_tokens_request(body: bytes | str | dict[str, Any]) -> CountTokensRequest:
    """Validate a count_tokens body; any mistake is a 400 naming the field."""
    return parse_body(CountTokensRequest, body)


def prepare_messages(service: Service, request: MessagesRequest) -> PreparedRun:
    """Check the request against the model and tokenize it (400 and 404 raised here)."""
    converted = to_chat(request)
    prepared = prepare_chat(service, converted.chat)
    if converted.prefill:
        prepared = _with_prefill(prepared, converted.prefill, request.max_tokens)
    return replace(prepared, id_prefix=ID_PREFIX)


def _with_prefill(prepared: PreparedRun, prefill: str, max_tokens: int) -> PreparedRun:
    """The prompt with the prefill's tokens after it (400 when the two no longer fit)."""
    generator = prepared.generator
    ids = _prefill_ids(generator, prefill)
    prompts = [prompt + ids for prompt in prepared.prompts]
    resolve_max_tokens(
        generator, len(prompts[0]), max_tokens, param="max_tokens", prompt_param="messages"
    )
    return replace(prepared, prompts=prompts)


def _prefill_ids(generator: HostedGenerator, prefill: str) -> list[int]:
    """Token ids of the prefill text, as the start of the reply (no special tokens)."""
    return generator.tokenizer.encode(prefill, add_special_tokens=False)


def prompt_tokens(service: Service, request: CountTokensRequest) -> int:
    """How many tokens the request's prompt is (template, tools and prefill included)."""
    converted = to_chat(request)
    generator = service.generator(request.model)
    num_tokens = len(encode_chat(generator, converted.chat))
    if converted.prefill:
        num_tokens += len(_prefill_ids(generator, converted.prefill))
    return num_tokens


async def count_tokens(service: Service, body: bytes | dict[str, Any]) -> dict[str, int]:
    """``{"input_tokens": n}`` for a count_tokens body (large ones off the event loop)."""
    size = len(body) if isinstance(body, bytes) else 0
    request = await run_sized(size, parse_count_tokens_request, body)
    service.generator(request.model)  # 404 / 400 before any tokenizing
    num_tokens = await run_sized(request.input_bytes(), prompt_tokens, service, request)
    return {"input_tokens": num_tokens}
