"""Which prompt positions a request's chunks ask to score, and how their scores are kept:
each position once, in order, however the prompt is chunked or recomputed."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.engine.core.step import PromptScoring, SeqChunk
from conveyor.engine.outputs import FinishReason, PromptLogprobs, TokenLogprobs
from conveyor.engine.request import GenerationRequest
from conveyor.engine.sampling.params import SamplingParams

PROMPT = [11, 12, 13, 14, 15, 16, 17]


class FakeDetokenizer:
    """Holds no text back."""

    stop_string: str | None = None

    def flush(self) -> str:
        return ""


class FakeTokenizer:
    """Only what a request needs of its tokenizer here: a detokenizer."""

    def detokenizer(self, **_: Any) -> FakeDetokenizer:
        return FakeDetokenizer()


def request(params: SamplingParams, prompt: list[int] = PROMPT) -> GenerationRequest:
    return GenerationRequest(
        request_id="r", prompt_token_ids=prompt, params=params, tokenizer=FakeTokenizer(),  # type: ignore[arg-type]
        eos_token_ids=(), max_model_len=64, arrival_s=0.0, prefix_group="group",
    )  # fmt: skip


def chunk(start: int, end: int) -> SeqChunk:
    return SeqChunk(tuple(PROMPT[start:end]), start, (0, 1), needs_logits=end == len(PROMPT))


def scores(scoring: PromptScoring) -> tuple[TokenLogprobs, ...]:
    """Made-up scores for the positions ``scoring`` names."""
    return tuple(
        TokenLogprobs(token_id=target, logprob=-float(scoring.first_pos + i), top=())
        for i, target in enumerate(scoring.target_ids)
    )


def test_chunks_score_their_positions_against_the_next_prompt_token() -> None:
    scored = request(SamplingParams(prompt_logprobs=2))
    first = scored.with_scoring(chunk(0, 4)).scoring
    assert first == PromptScoring(first_pos=0, target_ids=(12, 13, 14, 15), num_top=2)
    scored.add_prompt_scores(first, scores(first))
    last = scored.with_scoring(chunk(4, 7)).scoring
    # The last position predicts the first output token: the sampler's, not the prompt's.
    assert last == PromptScoring(first_pos=4, target_ids=(16, 17), num_top=2)
    scored.add_prompt_scores(last, scores(last))
    assert scored.with_scoring(chunk(0, 7)).scoring is None  # recomputed: nothing new
    assert [entry.logprob for entry in scored.prompt_scores] == [-0.0, -1, -2, -3, -4, -5]


def test_positions_recomputed_after_a_preemption_are_not_scored_again() -> None:
    scored = request(SamplingParams(prompt_logprobs=0))
    head = scored.with_scoring(chunk(0, 3)).scoring
    assert head is not None
    scored.add_prompt_scores(head, scores(head))
    again = scored.with_scoring(chunk(0, 5)).scoring  # preempted: computed from 0 again
    assert again == PromptScoring(first_pos=3, target_ids=(15, 16), num_top=0)
    with pytest.raises(ValueError, match="do not follow"):
        scored.add_prompt_scores(head, scores(head))  # the same positions twice


def test_a_request_without_prompt_logprobs_scores_nothing_and_shares_its_prompt() -> None:
    plain = request(SamplingParams())
    original = chunk(0, 7)
    assert plain.with_scoring(original) is original
    assert plain.seq.uses_prefix_cache and plain.seq.prefix_group == "group"
    scored = request(SamplingParams(prompt_logprobs=1))
    # It computes every position, so it neither reads the cache nor waits for a sibling.
    assert not scored.seq.uses_prefix_cache and scored.seq.prefix_group is None


def test_the_prompt_logprobs_go_out_once() -> None:
    scored = request(SamplingParams(prompt_logprobs=1, max_tokens=0), prompt=[11])
    assert scored.with_scoring(SeqChunk((11,), 0, (0,), needs_logits=True)).scoring is None
    first = scored.final_output(FinishReason.LENGTH, now_s=1.0)
    assert first.prompt_logprobs == PromptLogprobs((11,), ())  # one token: nothing to score
    assert scored.final_output(FinishReason.LENGTH, now_s=2.0).prompt_logprobs is None
    plain = request(SamplingParams(max_tokens=0))
    assert plain.final_output(FinishReason.LENGTH, now_s=1.0).prompt_logprobs is None
