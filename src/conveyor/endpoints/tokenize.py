"""``/tokenize`` and ``/detokenize`` in vLLM's shapes: a prompt or chat to ids and back."""

from __future__ import annotations

from typing import Any

from conveyor.endpoints.chat import encode_chat, parse_chat_request
from conveyor.endpoints.schemas import DetokenizeRequest, TokenizeRequest
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest
from conveyor.host.offload import run_sized
from conveyor.host.service import Service


async def run_tokenize(service: Service, body: bytes | dict[str, Any]) -> dict[str, Any]:
    """``{count, max_model_len, tokens, token_strs}`` for a prompt or a chat.

    A text over the model's ``max_input_bytes`` is refused before tokenizing; a large body
    is parsed, and a large prompt or chat tokenized, off the event loop.
    """
    size = len(body) if isinstance(body, bytes) else 0
    request = await run_sized(size, parse_body, TokenizeRequest, body)
    if (request.prompt is None) == (request.messages is None):
        raise InvalidRequest("give exactly one of 'prompt' and 'messages'", param="prompt")
    if not request.add_generation_prompt:
        raise InvalidRequest(
            "add_generation_prompt false is not supported", param="add_generation_prompt"
        )
    tokenizer = await service.text_tokenizer(request.model)
    if request.prompt is not None:
        add_special = request.add_special_tokens is not False
        ids = await run_sized(
            len(request.prompt), tokenizer.encode, request.prompt, add_special_tokens=add_special
        )
    elif request.add_special_tokens:
        raise InvalidRequest(
            "add_special_tokens applies to a prompt; a chat template adds its own",
            param="add_special_tokens",
        )
    else:
        ids = await run_sized(size, _chat_ids, service, request)
    return {
        "count": len(ids),
        "max_model_len": tokenizer.max_model_len,
        "tokens": ids,
        "token_strs": tokenizer.token_strs(ids) if request.return_token_strs else None,
    }


def _chat_ids(service: Service, request: TokenizeRequest) -> list[int]:
    """The ids the chat endpoint would send the model for these messages (and tools)."""
    chat: dict[str, Any] = {"model": request.model, "messages": request.messages}
    if request.tools is not None:
        chat["tools"] = request.tools
    return encode_chat(service.generator(request.model), parse_chat_request(chat))


async def run_detokenize(service: Service, body: bytes | dict[str, Any]) -> dict[str, Any]:
    """``{prompt}``: the text of the given ids, special tokens included."""
    request = parse_body(DetokenizeRequest, body)
    tokenizer = await service.text_tokenizer(request.model)
    return {"prompt": tokenizer.decode(request.tokens)}
