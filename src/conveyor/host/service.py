"""The engine room shared by the HTTP API, batch jobs and the library: one door per
request kind on the model host (``host.model_host``).

``embed`` and ``score_pairs`` take a one-shot request, ``start_generation`` a prepared
generative one (completions, chat, messages, responses). Each resolves its model once,
admits the payer's tokens against the rate limits, counts the outcome and bills.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from conveyor.config.settings import ServerConfig
from conveyor.errors import ConveyorError, RateLimitBackendDown, RateLimited, TokensExceedLimit
from conveyor.host.hosted_model import HostedModel
from conveyor.host.model_host import GeneratorFactory, ModelFactory, ModelHost, ModelResolver
from conveyor.models.base import EmbeddingInput, EncodedInput, Vector, shorten_vectors
from conveyor.models.registry import build_embedding_model, build_generator
from conveyor.observability.context import note_model
from conveyor.observability.metrics import Metrics, ModelMetrics, outcome_of
from conveyor.priority import Priority
from conveyor.tenants.ledger import UsageLedger
from conveyor.tenants.usage import Admission, Payer, UsageEvent, cost_usd

if TYPE_CHECKING:
    from conveyor.engine.generator import HostedGenerator
    from conveyor.engine.sampling.params import SamplingParams
    from conveyor.engine.stream import GenerationStream


@dataclass(slots=True, frozen=True)
class EmbedResult:
    """Vectors in input order and the real number of tokens they cost."""

    vectors: list[Vector]
    num_tokens: int


class Service(ModelHost):
    """The models of a config and one door per request kind into them.

    Use as ``async with Service(config) as service: await service.embed(...)``.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics | None = None,
        model_factory: ModelFactory = build_embedding_model,
        generator_factory: GeneratorFactory = build_generator,
        model_resolver: ModelResolver | None = None,
    ) -> None:
        """The host of ``config``'s models (see ``ModelHost``) and an online usage ledger."""
        super().__init__(
            config, metrics=metrics, model_factory=model_factory,
            generator_factory=generator_factory, model_resolver=model_resolver,
        )  # fmt: skip
        # Online requests' usage; written to the job store once the app starts it.
        self.ledger = UsageLedger()

    async def embed(
        self,
        model: str,
        inputs: Sequence[EmbeddingInput],
        *,
        priority: Priority = Priority.ONLINE,
        timeout_ms: float | None = None,
        truncate: bool = False,
        dimensions: int | None = None,
        payer: Payer | None = None,
    ) -> EmbedResult:
        """Embed ``inputs`` with ``model``; each input is batched like a separate request.

        The one door for embeddings, HTTP requests, batch lines and the library alike: the
        request outcome and latency metrics count them all, ``payer``'s tokens are
        admitted here once counted, and ``payer`` is billed.
        """

        async def encode(hosted: HostedModel) -> list[EncodedInput]:
            hosted.check_inputs(inputs, dimensions)
            return await hosted.encode_inputs(inputs, truncate)

        hosted, result = await self._run_one_shot(model, encode, priority, timeout_ms, payer)
        if dimensions is not None and dimensions < hosted.model.dim:
            return EmbedResult(shorten_vectors(result.vectors, dimensions), result.num_tokens)
        return result

    async def score_pairs(
        self,
        model: str,
        pairs: Sequence[tuple[str, str]],
        *,
        priority: Priority = Priority.ONLINE,
        timeout_ms: float | None = None,
        truncate: bool = False,
        payer: Payer | None = None,
    ) -> EmbedResult:
        """Score (query, document) pairs with a rerank model, each batched like an input.

        The one door for rerank and score: the same admission, deadlines, outcome metrics
        and billing as ``embed``.
        """

        async def encode(hosted: HostedModel) -> list[EncodedInput]:
            hosted.check_inputs(pairs, None)
            return await hosted.encode_pairs(pairs, truncate)

        return (await self._run_one_shot(model, encode, priority, timeout_ms, payer))[1]

    async def _run_one_shot(
        self,
        model: str,
        encode: Callable[[HostedModel], Awaitable[list[EncodedInput]]],
        priority: Priority,
        timeout_ms: float | None,
        payer: Payer | None,
    ) -> tuple[HostedModel, EmbedResult]:
        """Hold ``model`` (resolved once), encode, admit ``payer``'s tokens, batch every
        input and wait for them; the outcome is counted and ``payer`` billed."""
        note_model(model)
        resolved, metrics = self._one_shot(model)
        with counted_outcome(metrics, priority):
            async with self.using(model, resolved) as hosted:
                encoded = await encode(hosted)
                await self._admit(payer, model, sum(enc.num_tokens for enc in encoded), 0)
                items, num_tokens = hosted.admit_encoded(encoded, priority, timeout_ms)
                vectors = await hosted.gather_items(items)
        self.bill(payer, model, num_tokens, 0, sum(item.model_s for item in items))
        return hosted, EmbedResult(vectors, num_tokens)

    @staticmethod
    async def _admit(payer: Payer | None, model: str, num_input: int, num_output: int) -> None:
        """Admit a request's tokens against its payer's rate limits, if any apply: the one
        place every request kind is admitted, online and batch alike."""
        if payer is not None:
            await payer.admit(model, num_input, num_output)

    def online_payer(self, tenant: str, admission: Admission | None = None) -> Payer:
        """The payer of an online request of `tenant`: its usage goes to the ledger, and
        `admission` (rate limits) is admitted once its tokens are counted."""
        return Payer(tenant, self.ledger, admission)

    def bill(
        self, payer: Payer | None, model: str, input_tokens: int, output_tokens: int,
        model_s: float,
    ) -> None:  # fmt: skip
        """Count one finished request's usage and hand it to the payer's recorder."""
        if payer is None:
            return
        if payer.admission is not None:
            payer.admission.settle(input_tokens, output_tokens)
        cost = cost_usd(model_s, self.config.gpu_hour_usd(model))
        event = UsageEvent(payer.tenant, model, input_tokens, output_tokens, model_s, cost)
        self.metrics.usage.count(payer.tenant, model, input_tokens, output_tokens, model_s, cost)
        if payer.recorder is not None:
            payer.recorder.record(event, time.time())

    async def start_generation(
        self,
        prepared: PreparedGeneration,
        *,
        priority: Priority,
        timeout_ms: float | None,
        payer: Payer | None,
    ) -> GenerationStream:
        """Queue a prepared generation request: the one door of every generative kind
        (completions, chat, messages, responses), HTTP requests and batch lines alike.

        ``payer``'s tokens (the exact input, the most output) are admitted first; the
        prompts go to the model resolved when the request was prepared. Raises 429 when
        its waiting queue is full (counted in the model's outcome metrics).
        """
        note_model(prepared.model)
        await self._admit(payer, prepared.model, *prepared.token_ask())
        return _submit(prepared.generator, prepared.prompts, prepared.params, priority, timeout_ms)

    def generate(
        self,
        model: str,
        prompts: Sequence[list[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        priority: Priority = Priority.ONLINE,
        timeout_ms: float | None = None,
    ) -> GenerationStream:
        """Queue one sequence per prompt on a generative model; their outputs share a stream.

        The library's way in (requests go through ``start_generation``). Raises 404/400 for
        the wrong model and 429 when its waiting queue is full; counts such a refusal in
        the model's outcome metrics (the run counts the rest).
        """
        note_model(model)
        return _submit(self.generator(model), prompts, params, priority, timeout_ms)


def _submit(
    generator: HostedGenerator,
    prompts: Sequence[list[int]],
    params: SamplingParams | Sequence[SamplingParams],
    priority: Priority,
    timeout_ms: float | None,
) -> GenerationStream:
    """``generator.submit``, a refusal counted in its outcome metrics."""
    try:
        return generator.submit(prompts, params, priority=priority, timeout_ms=timeout_ms)
    except ConveyorError as exc:
        generator.metrics.requests[outcome_of(exc.status_code)].inc()
        raise


class PreparedGeneration(Protocol):
    """A generation request checked against its model and tokenized, ready to queue
    (``endpoints.generation.PreparedRun``)."""

    @property
    def generator(self) -> HostedGenerator:
        """The model it was prepared for."""
        ...

    @property
    def model(self) -> str:
        """The model's name in the request."""
        ...

    @property
    def prompts(self) -> list[list[int]]:
        """Token ids of each sequence to run."""
        ...

    @property
    def params(self) -> SamplingParams | list[SamplingParams]:
        """One params for all sequences, or one per sequence."""
        ...

    def token_ask(self) -> tuple[int, int]:
        """Input tokens and the most output tokens, as admitted against rate limits."""
        ...


@contextmanager
def counted_outcome(metrics: ModelMetrics, priority: Priority) -> Iterator[None]:
    """Count one request's outcome, and its latency (as ``priority``'s) when it succeeds."""
    started_s = time.perf_counter()
    try:
        yield
    except asyncio.CancelledError:
        metrics.requests["client_gone"].inc()
        raise
    except (RateLimited, TokensExceedLimit, RateLimitBackendDown):
        raise  # the tenant's limits refused it (counted there), not the model
    except ConveyorError as exc:
        metrics.requests[outcome_of(exc.status_code)].inc()
        raise
    metrics.requests["ok"].inc()
    metrics.latency_s[priority].observe(time.perf_counter() - started_s)
