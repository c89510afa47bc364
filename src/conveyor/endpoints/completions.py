"""``/v1/completions``: encode prompts, run them, format OpenAI's text completion objects."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from conveyor.endpoints.answers import check_logprob_entries
from conveyor.endpoints.completion_logprobs import legacy_logprobs
from conveyor.endpoints.generation import (
    SYSTEM_FINGERPRINT,
    ChoiceResult,
    GenerationRun,
    PreparedRun,
    check_prompt_size,
    check_token_ids,
    choice_params,
    resolve_max_tokens,
    sampling_params,
    usage_body,
)
from conveyor.endpoints.generation_schemas import CompletionRequest
from conveyor.endpoints.raw_id_lists import count_id_lists
from conveyor.endpoints.validation import parse_body
from conveyor.engine.generator import HostedGenerator
from conveyor.errors import InvalidRequest
from conveyor.host.offload import LARGE_INPUT_BYTES
from conveyor.host.service import Service
from conveyor.input_limits import utf8_size

__all__ = [
    "completion_body",
    "completion_chunks",
    "parse_completion_body",
    "parse_completion_request",
    "prepare_completion",
    "refuse_long_id_prompts",
]

OBJECT = "text_completion"


def parse_completion_request(body: bytes | str | dict[str, Any]) -> CompletionRequest:
    """Validate a completions body; any mistake is a 400 naming the field."""
    return parse_body(CompletionRequest, body)


def parse_completion_body(service: Service, raw: bytes) -> CompletionRequest:
    """``parse_completion_request`` of an HTTP body; a large one whose prompt of token ids
    leaves no room in the model's context is refused first, from its bytes."""
    if len(raw) >= LARGE_INPUT_BYTES:
        refuse_long_id_prompts(service, raw)
    return parse_completion_request(raw)


def refuse_long_id_prompts(service: Service, raw: bytes) -> None:
    """The 400 a prompt of token ids with no room left in the context gets, before parsing.

    Parsing millions of ids holds the interpreter lock the event loop needs for as long;
    ``raw_id_lists`` counts them in the bytes. Nothing is refused when that cannot tell.
    """
    counted = count_id_lists(raw, "prompt")
    model = counted.fields.get("model") if counted is not None else None
    if counted is None or not isinstance(model, str):
        return
    generator = service.generator(model)
    for size in counted.sizes:  # the first prompt with no room is the one named
        if size >= generator.max_model_len:
            resolve_max_tokens(generator, size, None, param="max_tokens", prompt_param="prompt")


def encode_prompts(
    generator: HostedGenerator, request: CompletionRequest
) -> tuple[list[list[int]], list[int]]:
    """Token ids of every prompt and its output budget; a 400 at the first that cannot run.

    Prompts are taken one at a time, so nothing after an over-long prompt is tokenized: a
    text is bounded by its size before tokenizing, an id list by the context before its ids
    are checked.
    """
    prompts: list[list[int]] = []
    budgets: list[int] = []
    for prompt in request.prompts():
        if isinstance(prompt, str):
            check_prompt_size(generator, len(prompt), utf8_size(prompt), param="prompt")
            ids = generator.tokenizer.encode(prompt)
            budgets.append(_budget(generator, request, len(ids)))
        else:
            budgets.append(_budget(generator, request, len(prompt)))
            check_token_ids(generator, prompt, param="prompt")
            ids = list(prompt)
        if not ids:
            raise InvalidRequest("the prompt encodes to no tokens", param="prompt")
        prompts.append(ids)
    return prompts, budgets


def _budget(generator: HostedGenerator, request: CompletionRequest, num_prompt_tokens: int) -> int:
    """The prompt's output budget (400 when the context has no room for it)."""
    return resolve_max_tokens(
        generator, num_prompt_tokens, request.max_tokens, param="max_tokens", prompt_param="prompt"
    )


def prepare_completion(
    service: Service,
    request: CompletionRequest,
) -> PreparedRun:
    """Check every prompt against the model and tokenize it (400 and 404 raised here).

    With ``echo`` and ``logprobs`` the prompt's own tokens get logprobs too.
    """
    generator = service.generator(request.model)
    num_choices = request.num_choices
    num_prompts = len(request.prompts())
    if request.max_tokens is not None:  # the answer's size is known before tokenizing
        check_logprob_entries(
            generator, num_prompts * num_choices * request.max_tokens, request.logprobs,
            param="logprobs",
        )  # fmt: skip
    prompts, budgets = encode_prompts(generator, request)
    echoed = sum(len(ids) for ids in prompts) if request.echo else 0
    check_logprob_entries(
        generator, num_choices * (sum(budgets) + echoed), request.logprobs, param="logprobs"
    )
    # One params for all prompts; each request is still capped by its own context room.
    params = sampling_params(
        request,
        max_tokens=max(budgets),
        num_logprobs=request.logprobs,
        vocab_size=generator.vocab_size,
    )
    if request.echo and request.logprobs is not None:
        params = replace(params, prompt_logprobs=request.logprobs)
    # n choices per prompt, prompt-major: choice index = prompt index * n + i.
    per_choice = choice_params(params, num_choices)
    prefixes: tuple[str, ...] = ()
    if request.echo:
        texts = [generator.tokenizer.decode(ids) for ids in prompts]
        prefixes = tuple(text for text in texts for _ in range(num_choices))
    return PreparedRun(
        generator,
        "cmpl",
        request.model,
        [ids for ids in prompts for _ in range(num_choices)],
        per_choice * len(prompts),
        prefixes=prefixes,
        num_choices=num_choices,
    )


def completion_body(run: GenerationRun, results: Sequence[ChoiceResult]) -> dict[str, Any]:
    """OpenAI's ``text_completion`` object for finished results."""
    choices = [
        {
            "index": result.index,
            "text": result.text,
            "logprobs": legacy_logprobs(
                run.generator, result.prompt_logprobs, result.logprobs, result.text_offsets
            ),
            "finish_reason": result.finish_reason,
        }
        for result in results
    ]
    num_output = sum(result.num_output_tokens for result in results)
    return {
        **_envelope(run),
        "choices": choices,
        "usage": usage_body(run.total_prompt_tokens, num_output),
    }


async def completion_chunks(
    run: GenerationRun, *, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """The streamed chunks (without the ``[DONE]`` sentinel), usage chunk last if asked."""
    text_lengths: dict[int, int] = {}
    async for output in run.outputs():
        text = output.text
        offset = text_lengths.get(output.index, 0)
        if output.index not in text_lengths and output.index < len(run.prefixes):
            text = run.prefixes[output.index] + text  # echo: the prompt comes first
            offset = len(run.prefixes[output.index])
        text_lengths[output.index] = offset + len(output.text)
        has_logprobs = bool(output.logprobs) or output.prompt_logprobs is not None
        if not text and not output.token_ids and not has_logprobs and not output.is_finished:
            continue  # no new token: nothing to send
        # A token whose text is held back (it completes no character yet, or may start a
        # stop string) still gets its chunk, its text empty, as vLLM's server sends it:
        # the first chunk marks the first token, and a client sees every step's progress.
        logprobs = legacy_logprobs(
            run.generator, output.prompt_logprobs, output.logprobs, [offset] * len(output.logprobs)
        )
        choice = {
            "index": output.index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": None if output.finish_reason is None else output.finish_reason.value,
        }
        chunk: dict[str, Any] = {**_envelope(run), "choices": [choice]}
        if include_usage:
            chunk["usage"] = None
        yield chunk
    if include_usage:
        usage = usage_body(run.total_prompt_tokens, run.total_output_tokens)
        yield {**_envelope(run), "choices": [], "usage": usage}


def _envelope(run: GenerationRun) -> dict[str, Any]:
    """The fields every completion object and chunk starts with."""
    return {
        "id": run.id,
        "object": OBJECT,
        "created": run.created,
        "model": run.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
