"""One generation request inside the engine: stop conditions, text, and what each step adds.

Lives on the engine thread. The event loop only ever sees the immutable
``GenerationOutput`` values (see ``outputs``) a request hands out, one per sampled token.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from conveyor.engine.core.sequence import Sequence
from conveyor.engine.core.step import PromptScoring, SeqChunk
from conveyor.engine.outputs import (
    FinishReason,
    GenerationOutput,
    PromptLogprobs,
    RequestTimings,
    TokenLogprobs,
)
from conveyor.engine.sampling.logits import TokenHistory
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.sampling.sampler import new_generator
from conveyor.engine.tokenizer import Detokenizer, Tokenizer
from conveyor.observability.context import RequestContext
from conveyor.priority import Priority

if TYPE_CHECKING:  # named in annotations only
    import llguidance

__all__ = ["GenerationRequest"]

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class GenerationRequest:
    """A request's engine-side state: its sequence, sampler inputs, detokenizer and stops.

    ``max_model_len`` caps prompt plus output; ``eos_token_ids`` end the request unless
    ``params.ignore_eos``. Built on the caller's thread, then owned by the engine thread.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    tokenizer: Tokenizer
    eos_token_ids: Collection[int]
    max_model_len: int
    arrival_s: float
    priority: Priority = Priority.ONLINE
    index: int = 0
    # Shared by requests with the same prompt in one call (n choices); see ``Sequence``.
    prefix_group: str | None = None
    # The LoRA adapter to run with (0: the base model alone).
    adapter_id: int = 0
    # The HTTP request (or batch line) this came from: its trace gets the engine's spans.
    origin: RequestContext | None = None
    # When its first token is due (``time.monotonic()``); None: no deadline.
    deadline_s: float | None = None
    seq: Sequence = field(init=False)
    generator: torch.Generator | None = field(init=False)
    detokenizer: Detokenizer = field(init=False)
    max_output_tokens: int = field(init=False)
    first_token_s: float | None = field(init=False, default=None)
    last_token_s: float | None = field(init=False, default=None)
    finished_s: float | None = field(init=False, default=None)
    finish_reason: FinishReason | None = field(init=False, default=None)
    # How many times the sequence got KV blocks (admissions plus re-admissions).
    num_admissions: int = field(init=False, default=0)
    # The grammar's state (``params.grammar``); the engine thread builds and advances it.
    matcher: llguidance.LLMatcher | None = field(init=False, default=None)
    # Its share of every step's model time, by tokens computed (see ``LLMEngine._step``).
    model_s: float = field(init=False, default=0.0)
    # Prompt logprobs so far: entry i is about prompt token i + 1 (see ``PromptLogprobs``).
    prompt_scores: list[TokenLogprobs] = field(init=False, default_factory=list)
    is_prompt_logprobs_sent: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if len(self.prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(self.prompt_token_ids)} tokens; the context length is "
                f"{self.max_model_len}, which leaves no room for output"
            )
        # arrival is set by the engine when it queues the sequence (a strict order).
        # Prompt logprobs need every position computed: no prefix-cache reads, so no
        # waiting for a sibling to fill the cache either.
        is_scored = self.params.prompt_logprobs is not None
        self.seq = Sequence(
            self.request_id,
            self.prompt_token_ids,
            priority=self.priority,
            prefix_group=None if is_scored else self.prefix_group,
            adapter_id=self.adapter_id,
            uses_prefix_cache=not is_scored,
        )
        self.generator = None if self.params.seed is None else new_generator(self.params.seed)
        self.detokenizer = self.tokenizer.detokenizer(
            prompt_ids=self.prompt_token_ids, stop=self.params.stop
        )
        room = self.max_model_len - len(self.prompt_token_ids)
        self.max_output_tokens = min(self.params.max_tokens, room)
        self.eos_token_ids = frozenset(self.eos_token_ids)

    @property
    def is_finished(self) -> bool:
        """Whether a stop condition has been met."""
        return self.finish_reason is not None

    def history(self) -> TokenHistory | None:
        """The tokens this request's penalties look at; None when its params have none."""
        if not self.params.shapes_logits:
            return None
        return TokenHistory(self.seq.token_ids, len(self.prompt_token_ids))

    def timings(self) -> RequestTimings:
        """The request's timestamps so far."""
        return RequestTimings(self.arrival_s, self.first_token_s, self.finished_s)

    def with_scoring(self, chunk: SeqChunk) -> SeqChunk:
        """``chunk`` asking for the prompt positions in it that are still to be scored.

        Position ``p`` is scored against prompt token ``p + 1``; positions scored before
        (a chunk recomputed after a preemption) are not scored again.
        """
        num_top = self.params.prompt_logprobs
        if num_top is None:
            return chunk
        first = max(chunk.start_pos, len(self.prompt_scores))
        end = min(chunk.end_pos, len(self.prompt_token_ids) - 1)
        if first >= end:
            return chunk
        targets = tuple(self.prompt_token_ids[first + 1 : end + 1])
        return replace(chunk, scoring=PromptScoring(first, targets, num_top))

    def add_prompt_scores(self, scoring: PromptScoring, scores: tuple[TokenLogprobs, ...]) -> None:
        """Keep the scores of a chunk's positions (``scoring`` says which they are)."""
        if scoring.first_pos != len(self.prompt_scores) or len(scores) != len(scoring.target_ids):
            raise ValueError(
                f"request {self.request_id}: scores for positions {scoring.first_pos}.."
                f"{scoring.end_pos} do not follow the {len(self.prompt_scores)} kept"
            )
        self.prompt_scores.extend(scores)

    def add_token(
        self, token_id: int, logprobs: TokenLogprobs | None, now_s: float
    ) -> GenerationOutput:
        """Account for a token the scheduler has appended; check every stop condition.

        Order: a stop token ends the request without adding its text; otherwise the
        token's text is checked for stop strings; then ``max_tokens`` and the context
        length end it with ``length``.
        """
        if self.first_token_s is None:
            self.first_token_s = now_s
        self.last_token_s = now_s
        text, reason = self._text_and_reason(token_id)
        if reason is not None:
            self.finish(reason, now_s)
        return self._output((token_id,), text, () if logprobs is None else (logprobs,))

    def finish(self, reason: FinishReason, now_s: float) -> None:
        """Record the end of the request (idempotent: the first reason wins)."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.finished_s = now_s

    def final_output(self, reason: FinishReason, now_s: float) -> GenerationOutput:
        """An output with no new token that ends the request (text still held back)."""
        self.finish(reason, now_s)
        return self._output((), self.detokenizer.flush(), ())

    def _text_and_reason(self, token_id: int) -> tuple[str, FinishReason | None]:
        """The text this token releases and the stop condition it meets, if any."""
        params = self.params
        is_eos = not params.ignore_eos and token_id in self.eos_token_ids
        if is_eos or token_id in params.stop_token_ids:
            return self.detokenizer.flush(), FinishReason.STOP
        piece = self.detokenizer.add_token(token_id)
        if piece.is_stopped:
            return piece.text, FinishReason.STOP
        if self._is_grammar_complete(token_id):
            return piece.text + self.detokenizer.flush(), FinishReason.STOP
        if self.seq.num_output_tokens >= self.max_output_tokens:
            return piece.text + self.detokenizer.flush(), FinishReason.LENGTH
        return piece.text, None

    def _is_grammar_complete(self, token_id: int) -> bool:
        """Advance the grammar by ``token_id``; True once it admits nothing but the end."""
        matcher = self.matcher
        if matcher is None:
            return False
        if not matcher.consume_token(token_id):
            # The mask makes this unreachable; end the request rather than emit garbage.
            log.error(
                "request %s: grammar refused token %d: %s",
                self.request_id,
                token_id,
                matcher.get_error(),
            )
            return True
        return matcher.is_stopped()

    def _take_prompt_logprobs(self) -> PromptLogprobs | None:
        """The prompt's logprobs, once (for the first output), when they were asked for."""
        if self.params.prompt_logprobs is None or self.is_prompt_logprobs_sent:
            return None
        self.is_prompt_logprobs_sent = True
        return PromptLogprobs(tuple(self.prompt_token_ids), tuple(self.prompt_scores))

    def _output(
        self, token_ids: tuple[int, ...], text: str, logprobs: tuple[TokenLogprobs, ...]
    ) -> GenerationOutput:
        """Freeze the request's current state into an output value."""
        return GenerationOutput(
            index=self.index,
            token_ids=token_ids,
            text=text,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            num_prompt_tokens=len(self.prompt_token_ids),
            num_output_tokens=self.seq.num_output_tokens,
            num_cached_tokens=self.seq.num_cached_tokens,
            timings=self.timings(),
            model_s=self.model_s,
            prompt_logprobs=self._take_prompt_logprobs(),
            stop_string=self.detokenizer.stop_string,
        )
