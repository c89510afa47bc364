"""``/v1/chat/completions``: apply the chat template, run, format OpenAI's chat objects."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from conveyor.endpoints.answers import check_logprob_entries
from conveyor.endpoints.chat_schemas import ChatCompletionRequest, FunctionTool, NamedToolChoice
from conveyor.endpoints.generation import (
    SYSTEM_FINGERPRINT,
    ChoiceResult,
    GenerationRun,
    PreparedRun,
    check_prompt_size,
    choice_params,
    resolve_max_tokens,
    sampling_params,
    usage_body,
)
from conveyor.endpoints.tool_stream import Event, ToolCallStream, stream_deltas
from conveyor.endpoints.tools import (
    ParsedCall,
    new_call_id,
    parse_tool_calls,
    template_messages,
    template_tools,
    tool_call_grammar,
)
from conveyor.endpoints.validation import parse_body
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.outputs import FinishReason, TokenLogprobs
from conveyor.engine.sampling.grammar import grammar_from_json_schema
from conveyor.errors import InvalidRequest
from conveyor.host.service import Service

__all__ = [
    "chat_body",
    "chat_chunks",
    "parse_chat_request",
    "prepare_chat",
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
    check_prompt_size(generator, request.input_bytes(), request.text_bytes(), param="messages")
    tokenizer = generator.tokenizer
    has_tools = tokenizer.supports_tools
    messages = template_messages(request, template_has_tools=has_tools)
    try:
        return tokenizer.apply_chat_template(
            messages, tools=template_tools(request) if has_tools else None
        )
    except Exception as exc:  # template errors (jinja raise_exception) are the caller's input
        message = f"the chat template rejected the messages: {exc}"
        raise InvalidRequest(message, param="messages") from None


def prepare_chat(
    service: Service,
    request: ChatCompletionRequest,
) -> PreparedRun:
    """Check the conversation against the model and tokenize it (400 and 404 raised here)."""
    generator = service.generator(request.model)
    requested = request.requested_max_tokens
    if requested is not None:  # the answer's size is known before tokenizing
        _check_answer_size(generator, request, requested)
    prompt = encode_chat(generator, request)
    param = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
    max_tokens = resolve_max_tokens(
        generator, len(prompt), requested, param=param, prompt_param="messages"
    )
    _check_answer_size(generator, request, max_tokens)
    params = sampling_params(
        request,
        max_tokens=max_tokens,
        num_logprobs=request.num_logprobs,
        vocab_size=generator.vocab_size,
        grammar=reply_grammar(generator, request),
    )
    num_choices = request.num_choices
    return PreparedRun(
        generator,
        "chatcmpl",
        request.model,
        [prompt] * num_choices,
        choice_params(params, num_choices),
        tool_names=_parsed_names(request),
        num_choices=num_choices,
    )


def _parsed_names(request: ChatCompletionRequest) -> tuple[str, ...]:
    """The functions whose calls are parsed out of the reply: the named one when forced."""
    choice = request.effective_tool_choice
    if isinstance(choice, NamedToolChoice):
        return (choice.function.name,)
    return () if choice == "none" else request.tool_names


def _check_answer_size(
    generator: HostedGenerator, request: ChatCompletionRequest, max_tokens: int
) -> None:
    """400 when ``n`` choices of ``max_tokens`` would carry too many logprob entries."""
    check_logprob_entries(
        generator, request.num_choices * max_tokens, request.num_logprobs,
        param="top_logprobs" if request.top_logprobs else "logprobs",
    )  # fmt: skip


def reply_grammar(generator: HostedGenerator, request: ChatCompletionRequest) -> str | None:
    """The grammar the reply must follow, checked for this model; None: free text.

    A ``required`` or named ``tool_choice`` forces tool calls (each forced function's
    ``parameters`` are checked as a schema of their own too, so one no value satisfies is
    named); otherwise a JSON ``response_format`` forces JSON.
    """
    choice = request.effective_tool_choice
    if isinstance(choice, NamedToolChoice):
        return _forced_calls(generator, request, choice.function.name)
    if choice == "required":
        return _forced_calls(generator, request, None)
    grammar = _format_grammar(request)
    return None if grammar is None else _checked(generator, grammar, param="response_format")


def _forced_calls(
    generator: HostedGenerator, request: ChatCompletionRequest, name: str | None
) -> str:
    """The checked grammar of calls to ``name`` (None: to any of the tools)."""
    for tool in request.tools or []:
        if name is None or tool.function.name == name:
            _check_parameters(generator, tool)
    return _checked(generator, tool_call_grammar(request, name=name), param="tools")


def _check_parameters(generator: HostedGenerator, tool: FunctionTool) -> None:
    """400 naming ``tools`` unless the function's ``parameters`` admit some arguments."""
    if tool.function.parameters is None:
        return
    what = f"function {tool.function.name!r} parameters"
    try:
        grammar = grammar_from_json_schema(tool.function.parameters)
    except ValueError as exc:
        raise InvalidRequest(f"invalid tools: {what}: {exc}", param="tools") from None
    _checked(generator, grammar, param="tools", what=what)


def _checked(generator: HostedGenerator, grammar: str, *, param: str, what: str = "") -> str:
    """``grammar``, once the model's compiler accepts it; else a 400 naming ``param``."""
    try:
        generator.engine.grammars.check(grammar)
    except ValueError as exc:
        where = f"{param}: {what}" if what else param
        raise InvalidRequest(f"invalid {where}: {exc}", param=param) from None
    return grammar


def _format_grammar(request: ChatCompletionRequest) -> str | None:
    """The grammar of a JSON ``response_format``; None for text."""
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None
    schema: dict[str, Any] = {"type": "object"}
    if response_format.json_schema is not None:
        schema = response_format.json_schema.schema_ or {}
    try:
        return grammar_from_json_schema(schema)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="response_format") from None


def chat_body(run: GenerationRun, results: Sequence[ChoiceResult]) -> dict[str, Any]:
    """OpenAI's ``chat.completion`` object for finished results."""
    choices = [_choice_body(run, result) for result in results]
    num_output = sum(result.num_output_tokens for result in results)
    return {
        **_envelope(run, OBJECT),
        "choices": choices,
        "usage": usage_body(run.total_prompt_tokens, num_output),
    }


def _choice_body(run: GenerationRun, result: ChoiceResult) -> dict[str, Any]:
    """One choice: the message (tool calls parsed out when tools were given)."""
    calls: list[ParsedCall] = []
    content: str | None = result.text
    if run.tool_names:
        is_cut = result.finish_reason == FinishReason.LENGTH.value
        content, calls = parse_tool_calls(result.text, run.tool_names, is_cut=is_cut)
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    finish_reason = result.finish_reason
    if calls:
        message["tool_calls"] = [_call_body(call) for call in calls]
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return {
        "index": result.index,
        "message": message,
        "logprobs": _logprobs_body(run.generator, result.logprobs),
        "finish_reason": finish_reason,
    }


def _call_body(call: ParsedCall) -> dict[str, Any]:
    """A ``tool_calls`` entry of a message."""
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": new_call_id(), "type": "function", "function": function}


async def chat_chunks(run: GenerationRun, *, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    """The streamed chunks (without ``[DONE]``): the role first, then content, then the end.

    The last chunk of a choice carries an empty delta and its ``finish_reason``, as
    OpenAI's do; with ``include_usage`` every chunk has ``usage: null`` and a final
    chunk with no choices carries the totals.
    """
    extra: dict[str, Any] = {"usage": None} if include_usage else {}
    parsers: dict[int, ToolCallStream] = {}
    async for output in run.outputs():
        index = output.index
        if index not in parsers:
            parsers[index] = ToolCallStream(run.tool_names)
            role = {"role": "assistant", "content": "", "refusal": None}
            yield _chunk(run, index, role, None, None, extra)
        parser = parsers[index]
        logprobs = _logprobs_body(run.generator, list(output.logprobs))
        events: list[Event] = parser.feed(output.text) if run.tool_names else [output.text]
        if output.finish_reason is not None and run.tool_names:
            events += parser.finish(is_cut=output.finish_reason is FinishReason.LENGTH)
        for delta in stream_deltas(events, parser.num_calls):
            yield _chunk(run, index, delta, logprobs, None, extra)
            logprobs = None
        if logprobs is not None:
            yield _chunk(run, index, {"content": ""}, logprobs, None, extra)
        if output.finish_reason is not None:
            reason = output.finish_reason.value
            if parser.num_calls and reason == "stop":
                reason = "tool_calls"
            yield _chunk(run, index, {}, None, reason, extra)
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
    return {
        "id": run.id,
        "object": object_name,
        "created": run.created,
        "model": run.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


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
    text, raw = generator.tokenizer.token_piece(token_id)
    # The cached tuple itself: a dict of immutable values is left out of GC passes, which
    # otherwise took most of the time of building a million entries.
    return {"token": text, "logprob": logprob, "bytes": raw}
