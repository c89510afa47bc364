"""Prompt logprobs through the whole engine equal Hugging Face's log-softmax at every prompt
position, however the prompt is computed: in one step, in chunks, beside a cached copy of
it, or again after a preemption; ``max_tokens`` 0 ends at the prompt without a sample."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.llm_engine import LLMEngine
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.outputs import FinishReason, PromptLogprobs
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.tokenizer import Tokenizer
from conveyor.errors import InvalidRequest
from tests.unit.model_helpers import (
    HFReference,
    Result,
    collect,
    engine_config,
    generate,
    make_runner,
    random_prompts,
    running_engine,
    submit,
    wait_idle,
)

pytestmark = [pytest.mark.anyio, pytest.mark.model]

VOCAB_SIZE = 512
TOLERANCE = 1e-4  # float32 on both sides; chunking changes only the summation order
NUM_TOP = 3


def scored(max_tokens: int = 0, num_top: int | None = NUM_TOP) -> SamplingParams:
    """Greedy, with prompt logprobs and ``num_top`` alternatives per prompt token."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, prompt_logprobs=num_top)


def hf_log_probs(reference: HFReference, prompt: Sequence[int]) -> torch.Tensor:
    """Hugging Face's log-softmax [len(prompt), vocab] over the whole prompt at once."""
    with torch.no_grad():
        logits = reference.model(torch.tensor([list(prompt)])).logits[0]
    return torch.log_softmax(logits.to(torch.float32), dim=-1)


def prompt_logprobs_of(result: Result) -> PromptLogprobs:
    """The one output of a request that carries its prompt logprobs."""
    carried = [o.prompt_logprobs for o in result.outputs if o.prompt_logprobs is not None]
    assert len(carried) == 1
    return carried[0]


def assert_matches_hf(reference: HFReference, prompt: list[int], found: PromptLogprobs) -> None:
    """Each prompt token's logprob and top alternatives equal Hugging Face's."""
    expected = hf_log_probs(reference, prompt)
    assert found.token_ids == tuple(prompt)
    assert len(found.entries) == len(prompt) - 1
    for position, entry in enumerate(found.entries):
        assert entry.token_id == prompt[position + 1]
        wanted = expected[position, prompt[position + 1]].item()
        assert entry.logprob == pytest.approx(wanted, abs=TOLERANCE), f"position {position}"
        values, ids = expected[position].topk(NUM_TOP)
        assert [token for token, _ in entry.top] == ids.tolist()
        assert [value for _, value in entry.top] == pytest.approx(values.tolist(), abs=TOLERANCE)


async def test_max_tokens_0_scores_the_prompt_and_samples_nothing(
    llama_path: Path, llama_reference: HFReference
) -> None:
    prompt = random_prompts([21], VOCAB_SIZE, seed=31)[0]
    with running_engine(llama_path, engine_config()) as engine:
        (result,) = await generate(engine, [prompt], scored())
        await wait_idle(engine)
        assert engine.num_used_blocks == 0 and engine.stats.num_generated_tokens == 0
    assert result.token_ids == [] and result.finish_reason is FinishReason.LENGTH
    assert result.outputs[-1].num_output_tokens == 0
    assert_matches_hf(llama_reference, prompt, prompt_logprobs_of(result))


async def test_the_first_token_follows_the_scored_prompt(
    llama_path: Path, llama_reference: HFReference
) -> None:
    prompt = random_prompts([17], VOCAB_SIZE, seed=32)[0]
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=1, prompt_logprobs=NUM_TOP)
    with running_engine(llama_path, engine_config()) as engine:
        (result,) = await generate(engine, [prompt], params)
    assert result.token_ids == llama_reference.generate(prompt, 4)
    assert result.outputs[0].prompt_logprobs is not None  # on the first output, only there
    assert_matches_hf(llama_reference, prompt, prompt_logprobs_of(result))
    first = result.outputs[0].logprobs[0]
    wanted = hf_log_probs(llama_reference, prompt)[-1, result.token_ids[0]].item()
    assert first.logprob == pytest.approx(wanted, abs=TOLERANCE)


async def test_a_prompt_prefilled_in_chunks_is_scored_whole(
    llama_path: Path, llama_reference: HFReference
) -> None:
    config = engine_config(max_num_batched_tokens=8, max_num_seqs=4)
    prompts = random_prompts([30, 45, 9, 50], VOCAB_SIZE, seed=33)
    with running_engine(llama_path, config) as engine:
        results = await generate(engine, prompts, [scored(), scored(3), scored(), scored(1)])
        assert engine.stats.num_partial_prefills > 0
    for prompt, result in zip(prompts, results, strict=True):
        assert_matches_hf(llama_reference, prompt, prompt_logprobs_of(result))


async def test_a_scored_prompt_fills_the_cache_but_never_reads_it(
    llama_path: Path, llama_reference: HFReference
) -> None:
    prompt = random_prompts([40], VOCAB_SIZE, seed=34)[0]
    plain = SamplingParams(temperature=0.0, max_tokens=2)
    with running_engine(llama_path, engine_config()) as engine:
        (first,) = await generate(engine, [prompt], scored())
        (reader,) = await generate(engine, [[*prompt, 7]], plain)
        assert reader.outputs[-1].num_cached_tokens == 40  # the scored run's blocks
        (again,) = await generate(engine, [prompt], scored())
        assert again.outputs[-1].num_cached_tokens == 0  # every position computed again
    for result in (first, again):
        assert_matches_hf(llama_reference, prompt, prompt_logprobs_of(result))


async def test_positions_recomputed_after_a_preemption_are_scored_once(
    llama_path: Path, llama_reference: HFReference
) -> None:
    # 8 requests of up to 42 tokens need ~80 blocks of 4; the pool has 20 (one max_model_len).
    config = engine_config(num_kv_blocks=20, max_model_len=80, max_num_seqs=8)
    prompts = random_prompts([20, 24, 18, 22, 26, 19, 21, 23], VOCAB_SIZE, seed=35)
    with running_engine(llama_path, config) as engine:
        results = await generate(engine, prompts, scored(max_tokens=16))
        assert engine.stats.num_preemptions > 0
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == llama_reference.generate(prompt, 16)
        assert_matches_hf(llama_reference, prompt, prompt_logprobs_of(result))


async def test_logprob_0_gives_the_prompt_tokens_own_logprobs_only(llama_path: Path) -> None:
    prompt = random_prompts([6], VOCAB_SIZE, seed=36)[0]
    with running_engine(llama_path, engine_config()) as engine:
        (bare,) = await generate(engine, [prompt], scored(num_top=0))
        (one,) = await generate(engine, [prompt[:1]], scored())
    entries = prompt_logprobs_of(bare).entries
    assert len(entries) == 5 and all(entry.top == () for entry in entries)
    assert prompt_logprobs_of(one) == PromptLogprobs((prompt[0],), ())  # nothing to score


async def test_requests_that_do_not_ask_put_no_extra_rows_through_the_lm_head(
    llama_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = engine_config()
    runner = make_runner(llama_path, config)
    rows: list[int] = []
    original = runner.model.logits

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        rows.append(hidden.shape[0])
        return original(hidden)

    monkeypatch.setattr(runner.model, "logits", counted)
    prompt = random_prompts([30], VOCAB_SIZE, seed=37)[0]
    with running_engine(llama_path, config, runner=runner) as engine:
        await generate(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=3))
        assert rows == [1, 1, 1] and runner.last_prompt_scores == []
        rows.clear()
        await generate(engine, [prompt], scored())
    assert rows == [1, 29]  # the last position's row (unsampled), then 29 scored in one slice


class PlainRunner:
    """A runner that cannot score prompts (it has no ``last_prompt_scores``)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.eos_token_ids = runner.eos_token_ids

    def execute(self, chunks: Sequence[SeqChunk]) -> Any:
        return self.runner.execute(chunks)


async def test_a_runner_that_cannot_score_refuses_prompt_logprobs(llama_path: Path) -> None:
    config = engine_config()
    engine = LLMEngine(PlainRunner(make_runner(llama_path, config)), Tokenizer(llama_path), config)
    engine.start()
    try:
        stream = submit(engine, [5, 6, 7], scored(), request_id="scored")
        with pytest.raises(InvalidRequest, match="cannot return prompt logprobs"):
            await collect(stream)
    finally:
        engine.stop()
