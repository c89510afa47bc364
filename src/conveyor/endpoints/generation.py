"""What completions and chat share: parsing, limits, sampling params, and one running call.

No HTTP here: the API streams or answers from a :class:`GenerationRun`, batch jobs
collect it into a response body.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from typing import Any

from conveyor.endpoints.generation_schemas import GenerationRequestBody
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.outputs import GenerationOutput, PromptLogprobs, TokenLogprobs
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.errors import ConveyorError, InvalidRequest
from conveyor.host.service import Service
from conveyor.input_limits import check_text_bytes
from conveyor.observability.metrics import outcome_of
from conveyor.priority import Priority
from conveyor.tenants.usage import Payer

__all__ = [
    "SYSTEM_FINGERPRINT",
    "ChoiceResult",
    "GenerationRun",
    "PreparedRun",
    "check_prompt_size",
    "check_token_ids",
    "prepare_counted",
    "resolve_max_tokens",
    "sampling_params",
    "token_text",
    "usage_body",
]

# OpenAI's backend-configuration marker; Conveyor's changes only with its version.
SYSTEM_FINGERPRINT = f"fp_conveyor_{version('conveyor')}"


def resolve_max_tokens(
    generator: HostedGenerator,
    num_prompt_tokens: int,
    requested: int | None,
    *,
    param: str,
    prompt_param: str,
) -> int:
    """The output budget: ``requested``, or all the room the context leaves; 400 if too long.

    ``param`` / ``prompt_param`` name the request's output-limit and prompt fields.
    """
    limit = generator.max_model_len
    if num_prompt_tokens >= limit:
        raise InvalidRequest(
            f"this model's maximum context length is {limit} tokens, and the prompt has "
            f"{num_prompt_tokens}: no room is left for output; shorten the prompt",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if requested is None:
        return limit - num_prompt_tokens
    if num_prompt_tokens + requested > limit:
        raise InvalidRequest(
            f"this model's maximum context length is {limit} tokens; you requested "
            f"{num_prompt_tokens + requested} ({num_prompt_tokens} in the prompt, {requested} "
            f"for the output); lower {param} or shorten the prompt",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def sampling_params(
    request: GenerationRequestBody,
    *,
    max_tokens: int,
    num_logprobs: int | None,
    vocab_size: int,
    grammar: str | None = None,
) -> SamplingParams:
    """The engine's params from a completions or chat body; 400 for values it refuses."""
    stop_token_ids = list(request.stop_token_ids or [])
    too_big = [token for token in stop_token_ids if token >= vocab_size]
    if too_big:
        raise InvalidRequest(
            f"stop_token_ids must be below the vocabulary size {vocab_size}; got {too_big}",
            param="stop_token_ids",
        )
    try:
        return SamplingParams(
            temperature=1.0 if request.temperature is None else float(request.temperature),
            top_p=1.0 if request.top_p is None else float(request.top_p),
            top_k=0 if request.top_k is None else request.top_k,
            seed=request.seed,
            max_tokens=max_tokens,
            stop=request.stop_strings(),
            stop_token_ids=stop_token_ids,
            ignore_eos=request.ignore_eos,
            logprobs=num_logprobs,
            presence_penalty=float(request.presence_penalty or 0.0),
            frequency_penalty=float(request.frequency_penalty or 0.0),
            repetition_penalty=float(request.repetition_penalty or 1.0),
            min_p=float(request.min_p or 0.0),
            logit_bias=[(i, b) for i, b in request.logit_bias_pairs() if i < vocab_size],
            grammar=grammar,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def choice_params(params: SamplingParams, num_choices: int) -> list[SamplingParams]:
    """One params per choice of a prompt: with a seed, choice ``i`` uses ``seed + i``.

    Otherwise ``n`` seeded choices would all be the same text.
    """
    if params.seed is None or num_choices == 1:
        return [params] * num_choices
    return [replace(params, seed=(params.seed + i) % 2**63) for i in range(num_choices)]


def check_token_ids(generator: HostedGenerator, token_ids: Sequence[int], *, param: str) -> None:
    """400 unless every id is inside the model's vocabulary."""
    vocab_size = generator.vocab_size
    if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab_size):
        return  # at C speed: the list below is built only to name the bad ids
    bad = [token for token in token_ids if not 0 <= token < vocab_size]
    if bad:
        raise InvalidRequest(f"token ids must be in [0, {vocab_size}); got {bad[:5]}", param=param)


def usage_body(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }


@dataclass(slots=True)
class ChoiceResult:
    """Everything one prompt produced, for a non-streamed response."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    # Character offset of each token's text in ``text`` (completions logprobs).
    text_offsets: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0
    # The prompt's own logprobs (completions' echo with logprobs).
    prompt_logprobs: PromptLogprobs | None = None
    # The stop string that ended the choice, if one did.
    stop_string: str | None = None


@dataclass(slots=True)
class GenerationRun:
    """One call in progress: its ids, prompts and the stream of outputs.

    Close it when done (idempotent): an unfinished run is then aborted in the engine.
    """

    id: str
    created: int
    model: str
    generator: HostedGenerator
    stream: GenerationStream
    num_prompt_tokens: list[int]
    # Functions whose calls are parsed out of the text (chat with tools).
    tool_names: tuple[str, ...] = ()
    # Text put before each choice's output (completions' echo).
    prefixes: tuple[str, ...] = ()
    # Choices per prompt: each prompt's choices are adjacent, and usage counts it once.
    num_choices: int = 1
    started_s: float = field(default_factory=time.perf_counter)
    # Online or batch: the latency histogram it is counted in.
    priority: Priority = Priority.ONLINE
    # Who pays, and the service that bills them (None: not billed, e.g. tests).
    payer: Payer | None = None
    service: Service | None = None
    _outcome: str | None = field(default=None, init=False)
    _model_s: dict[int, float] = field(default_factory=dict, init=False)
    _peeked: GenerationOutput | None = field(default=None, init=False)
    _num_output_tokens: dict[int, int] = field(default_factory=dict, init=False)

    @property
    def total_prompt_tokens(self) -> int:
        """Prompt tokens over every prompt, each counted once whatever its choices."""
        return sum(self.num_prompt_tokens[:: self.num_choices])

    @property
    def total_output_tokens(self) -> int:
        """Tokens generated so far over every prompt."""
        return sum(self._num_output_tokens.values())

    async def first(self) -> None:
        """Wait for the first output, so errors before any token surface as plain errors."""
        if self._peeked is None:
            try:
                self._peeked = await self.stream.get()
            except ConveyorError as exc:
                self._settle(outcome_of(exc.status_code))
                raise

    async def outputs(self) -> AsyncIterator[GenerationOutput]:
        """Every output in order (the peeked one first)."""
        if self._peeked is not None:
            peeked, self._peeked = self._peeked, None
            yield self._count(peeked)
        try:
            async for output in self.stream:
                yield self._count(output)
        except ConveyorError as exc:
            self._settle(outcome_of(exc.status_code))
            raise
        self._settle("ok")

    def _count(self, output: GenerationOutput) -> GenerationOutput:
        """Track the output token totals for ``usage``."""
        self._num_output_tokens[output.index] = output.num_output_tokens
        self._model_s[output.index] = output.model_s
        return output

    async def collect(self) -> list[ChoiceResult]:
        """Run to the end; one result per prompt, in prompt order."""
        results = [ChoiceResult(index) for index in range(len(self.num_prompt_tokens))]
        for result, prefix in zip(results, self.prefixes, strict=False):
            result.text = prefix
        async for output in self.outputs():
            result = results[output.index]
            for _ in output.token_ids:
                result.text_offsets.append(len(result.text))
            result.text += output.text
            result.token_ids.extend(output.token_ids)
            result.logprobs.extend(output.logprobs)
            if output.prompt_logprobs is not None:
                result.prompt_logprobs = output.prompt_logprobs
            result.num_output_tokens = output.num_output_tokens
            if output.finish_reason is not None:
                result.finish_reason = output.finish_reason.value
                result.stop_string = output.stop_string
        return results

    def close(self) -> None:
        """Stop listening and abort what has not finished (counted as the caller gone)."""
        self.stream.close()
        self._settle("client_gone")

    def _settle(self, outcome: str) -> None:
        """Count the run's outcome once, in the model's metrics (HTTP and batch alike)."""
        if self._outcome is not None:
            return
        self._outcome = outcome
        metrics = self.generator.metrics
        metrics.requests[outcome].inc()
        if outcome == "ok":
            metrics.latency_s[self.priority].observe(time.perf_counter() - self.started_s)
        if self.service is not None and (outcome == "ok" or self.total_output_tokens):
            # What ran is billed, finished or not (a dropped stream at what it produced).
            self.service.bill(
                self.payer, self.model, self.total_prompt_tokens, self.total_output_tokens,
                sum(self._model_s.values()),
            )  # fmt: skip


@dataclass(slots=True, frozen=True)
class PreparedRun:
    """A request checked against its model and tokenized, ready to submit.

    Preparing is pure CPU work (tokenizing, the chat template) and may run on any thread;
    ``start`` submits to the engine and must run on the event loop.
    """

    generator: HostedGenerator
    id_prefix: str
    model: str
    prompts: list[list[int]]
    params: SamplingParams | list[SamplingParams]
    tool_names: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    # Choices per prompt (``prompts`` holds each prompt once per choice, adjacent).
    num_choices: int = 1

    def token_ask(self) -> tuple[int, int]:
        """Exact input tokens (each prompt once, as usage counts them), and the most output
        tokens the run may produce (each choice's `max_tokens`, capped by the context room
        its prompt leaves)."""
        params = self.params if isinstance(self.params, list) else [self.params] * len(self.prompts)
        room = self.generator.max_model_len
        num_output = sum(
            min(p.max_tokens, room - len(prompt))
            for prompt, p in zip(self.prompts, params, strict=True)
        )
        num_input = sum(len(prompt) for prompt in self.prompts[:: self.num_choices])
        return num_input, num_output

    async def start(
        self,
        service: Service,
        *,
        priority: Priority,
        timeout_ms: float | None,
        payer: Payer | None = None,
    ) -> GenerationRun:
        """Admit ``payer``'s tokens and queue every prompt through the service's door for
        generation (``Service.start_generation``); the run (429 / 400 raised here).

        The run bills ``payer`` when it ends.
        """
        stream = await service.start_generation(
            self, priority=priority, timeout_ms=timeout_ms, payer=payer
        )
        return GenerationRun(
            id=f"{self.id_prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.model,
            generator=self.generator,
            stream=stream,
            num_prompt_tokens=[len(prompt) for prompt in self.prompts],
            tool_names=self.tool_names,
            prefixes=self.prefixes,
            num_choices=self.num_choices,
            priority=priority,
            payer=payer,
            service=service,
        )


def check_prompt_size(
    generator: HostedGenerator, num_chars: int, num_bytes: int, *, param: str
) -> None:
    """400 at once for prompt text whose length alone proves it exceeds the context, or
    that is over the model's ``max_input_bytes``.

    Tokenizing megabytes only to count them takes seconds and, while millions of ids become
    Python objects, holds the interpreter lock that the event loop needs.
    """
    limit = generator.max_model_len
    at_least = generator.tokenizer.min_tokens(num_chars)
    if at_least > limit:
        raise InvalidRequest(
            f"this model's maximum context length is {limit} tokens, and the prompt has at "
            f"least {at_least} ({num_chars} characters): shorten the prompt",
            param=param,
        )
    check_text_bytes(
        num_bytes, generator.max_input_bytes, subject="the prompt", param=param,
        hint="shorten the prompt",
    )  # fmt: skip


def prepare_counted(
    service: Service, prepare: Callable[[Service, Any], PreparedRun], request: Any
) -> PreparedRun:
    """``prepare(service, request)``; a refusal is counted in the model's outcome metrics.

    Any thread may call this (the counters are thread-safe).
    """
    try:
        return prepare(service, request)
    except ConveyorError as exc:
        generator = service.generators.get(request.model)
        if generator is not None:
            generator.metrics.requests[outcome_of(exc.status_code)].inc()
        raise


def token_text(generator: HostedGenerator, token_id: int) -> str:
    """How one token reads on its own (special tokens included), for logprobs."""
    return generator.tokenizer.token_piece(token_id)[0]
