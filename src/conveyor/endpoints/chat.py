"""``/v1/chat/completions``: apply the chat template, run, format OpenAI's chat objects."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from conveyor.endpoints.generation import (
    ChoiceResult,
    GenerationRun,
    PreparedRun,
    parse_body,
    resolve_max_tokens,
    run_unstreamed,
    sampling_params,
    token_text,
    usage_body,
)
from conveyor.endpoints.generation_schemas import ChatCompletionRequest
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.outputs import TokenLogprobs
from conveyor.errors import InvalidRequest
from conveyor.priority import Priority
from conveyor.service import Service

__all__ = [
    "chat_body",
    "chat_chunks",
    "parse_chat_request",
    "prepare_chat",
    "run_chat",
]

OBJECT = "chat.completion"
CHUNK_OBJECT = "chat.completion.chunk"


def parse_chat_request(body: bytes | str | dict[str, Any]) -> ChatCompletionRequest:
    """Validate a chat body; any mistake is a 400 naming the field."""
    return parse_body(ChatCompletionRequest, body)


def encode_chat(generator: HostedGenerator, request: ChatCompletionRequest) -> list[int]:
    """Token ids of the conversation through the model's chat template."""
    if not generator.tokenizer.has_chat_template:
        raise InvalidRequest(
            f"model {request.model!r} has no chat template; use /v1/completions",
            param="model",
        )
    messages = [message.to_template() for message in request.messages]
    try:
        return generator.tokenizer.apply_chat_template(messages)
    except Exception as exc:  # template errors (jinja raise_exception) are the caller's input
        message = f"the chat template rejected the messages: {exc}"
        raise InvalidRequest(message, param="messages") from None


def prepare_chat(
    service: Service,
    request: ChatCompletionRequest,
) -> PreparedRun:
    """Check the conversation against the model and tokenize it (400 and 404 raised here)."""
    generator = service.generator(request.model)
    prompt = encode_chat(generator, request)
    param = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
    max_tokens = resolve_max_tokens(
        generator,
        len(prompt),
        request.requested_max_tokens,
        param=param,
        prompt_param="messages",
    )
    params = sampling_params(
        request,
        max_tokens=max_tokens,
        num_logprobs=request.num_logprobs,
        vocab_size=generator.vocab_size,
    )
    return PreparedRun(generator, "chatcmpl", request.model, [prompt], params)


async def run_chat(
    service: Service,
    body: bytes | str | dict[str, Any] | ChatCompletionRequest,
    *,
    priority: Priority = Priority.ONLINE,
    timeout_ms: float | None = None,
) -> dict[str, Any]:
    """Run a whole (non-streamed) chat completion; cancelling this aborts the generation."""
    request = body if isinstance(body, ChatCompletionRequest) else parse_chat_request(body)
    return await run_unstreamed(
        service, request, prepare_chat, chat_body, priority=priority, timeout_ms=timeout_ms
    )


def chat_body(run: GenerationRun, results: Sequence[ChoiceResult]) -> dict[str, Any]:
    """OpenAI's ``chat.completion`` object for finished results."""
    choices = [
        {
            "index": result.index,
            "message": {"role": "assistant", "content": result.text},
            "logprobs": _logprobs_body(run.generator, result.logprobs),
            "finish_reason": result.finish_reason,
        }
        for result in results
    ]
    num_output = sum(result.num_output_tokens for result in results)
    return {
        **_envelope(run, OBJECT),
        "choices": choices,
        "usage": usage_body(run.total_prompt_tokens, num_output),
    }


async def chat_chunks(run: GenerationRun, *, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    """The streamed chunks (without ``[DONE]``): the role first, then content, then the end.

    The last chunk of a choice carries an empty delta and its ``finish_reason``, as
    OpenAI's do; with ``include_usage`` every chunk has ``usage: null`` and a final
    chunk with no choices carries the totals.
    """
    extra: dict[str, Any] = {"usage": None} if include_usage else {}
    has_started: set[int] = set()
    async for output in run.outputs():
        if output.index not in has_started:
            has_started.add(output.index)
            role = {"role": "assistant", "content": ""}
            yield _chunk(run, output.index, role, None, None, extra)
        if output.text or output.logprobs:
            content = {"content": output.text}
            logprobs = _logprobs_body(run.generator, list(output.logprobs))
            yield _chunk(run, output.index, content, logprobs, None, extra)
        if output.finish_reason is not None:
            yield _chunk(run, output.index, {}, None, output.finish_reason.value, extra)
    if include_usage:
        usage = usage_body(run.total_prompt_tokens, run.total_output_tokens)
        yield {**_envelope(run, CHUNK_OBJECT), "choices": [], "usage": usage}


def _chunk(
    run: GenerationRun,
    index: int,
    delta: dict[str, Any],
    logprobs: dict[str, Any] | None,
    finish_reason: str | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with a single choice."""
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {**_envelope(run, CHUNK_OBJECT), "choices": [choice], **extra}


def _envelope(run: GenerationRun, object_name: str) -> dict[str, Any]:
    """The fields every chat object and chunk starts with."""
    return {"id": run.id, "object": object_name, "created": run.created, "model": run.model}


def _logprobs_body(
    generator: HostedGenerator, logprobs: Sequence[TokenLogprobs]
) -> dict[str, Any] | None:
    """The chat ``logprobs`` object (``content`` per token); None when none were asked for."""
    if not logprobs:
        return None
    return {
        "content": [
            {
                **_token_entry(generator, item.token_id, item.logprob),
                "top_logprobs": [
                    _token_entry(generator, token_id, value) for token_id, value in item.top
                ],
            }
            for item in logprobs
        ],
        "refusal": None,
    }


def _token_entry(generator: HostedGenerator, token_id: int, logprob: float) -> dict[str, Any]:
    """``{"token", "logprob", "bytes"}`` for one token."""
    text = token_text(generator, token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
