"""Seeded sampling on the real SmolLM2-135M-Instruct is reproducible across batch compositions.

One chat call with ``n = 4`` and a seed goes the way the API sends it (``HostedGenerator``
with ``choice_params``: choice ``i`` samples with ``seed + i``, the four share their prompt's
KV blocks as a prefix group) beside four other requests. The same four seeds then run as
four independent requests, in reverse order, behind other companions, on an engine whose
small step budget chunks every prefill; and the first seed once more alone. Each choice's
tokens must be the same every time: a request's draws come from its own generator, so
neither its neighbours in a step nor how its prompt was split may change them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from conveyor.config.model_config import GenerateModelConfig
from conveyor.endpoints.generation import choice_params
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.null_metrics import null_generator_metrics
from conveyor.engine.outputs import GenerationOutput
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.tokenizer import Tokenizer
from tests.unit.model_helpers import collect, submit

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

NUM_CHOICES = 4
MAX_TOKENS = 24
SEED = 1234
SAMPLED = SamplingParams(
    temperature=1.0, top_p=0.95, seed=SEED, max_tokens=MAX_TOKENS, ignore_eos=True
)
QUESTION = "Tell me a short story about a robot who learns to paint."
COMPANIONS = (
    "The three primary colors are",
    "Write a limerick about a cat.",
    "The history of the printing press begins",
    "Name the largest ocean on Earth.",
    "A good breakfast includes",
    "Explain recursion to a child.",
)


def engine_on(runner: ModelRunner, tokenizer: Tokenizer, *, step_tokens: int) -> LLMEngine:
    """A started engine on the shared runner with a step budget of ``step_tokens``."""
    config = EngineConfig(
        max_num_seqs=16, max_num_batched_tokens=step_tokens, max_model_len=256,
        num_kv_blocks=runner.num_kv_blocks, block_size=runner.block_size,
    )  # fmt: skip
    engine = LLMEngine(runner, tokenizer, config)
    engine.start()
    return engine


def chat(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}])


def companion_params(index: int) -> SamplingParams:
    """Greedy and seeded companions in turn (their seeds far from the call's)."""
    if index % 2:
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return SamplingParams(temperature=0.8, seed=99 + index, max_tokens=MAX_TOKENS)


async def n_choices(
    generator: HostedGenerator, prompt: list[int]
) -> tuple[list[list[int]], list[GenerationOutput]]:
    """An ``n = 4`` call as the API submits it: each choice's tokens and its last output."""
    stream = generator.submit([prompt] * NUM_CHOICES, choice_params(SAMPLED, NUM_CHOICES))
    tokens: list[list[int]] = [[] for _ in range(NUM_CHOICES)]
    last: dict[int, GenerationOutput] = {}
    async for output in stream:
        tokens[output.index].extend(output.token_ids)
        last[output.index] = output
    return tokens, [last[index] for index in range(NUM_CHOICES)]


async def beside_companions(
    generator: HostedGenerator, prompt: list[int], others: Sequence[list[int]]
) -> tuple[list[list[int]], list[GenerationOutput]]:
    """The call and the companions queued in the same instant."""
    streams = [
        submit(generator.engine, other, companion_params(i), request_id=f"companion-{i}")
        for i, other in enumerate(others)
    ]
    found, *_ = await asyncio.gather(n_choices(generator, prompt), *map(collect, streams))
    return found


async def one_by_one(
    engine: LLMEngine, prompt: list[int], others: Sequence[list[int]]
) -> list[list[int]]:
    """Companions first, then each choice's seed as a request of its own, last seed first."""
    streams = [
        submit(engine, other, companion_params(i + 1), request_id=f"other-{i}")
        for i, other in enumerate(others)
    ]
    seeds = choice_params(SAMPLED, NUM_CHOICES)
    mine = {
        index: submit(engine, prompt, seeds[index], request_id=f"choice-{index}")
        for index in reversed(range(NUM_CHOICES))
    }
    results = await asyncio.gather(*(collect(mine[i]) for i in range(NUM_CHOICES)),
                                    *map(collect, streams))  # fmt: skip
    return [result.token_ids for result in results[:NUM_CHOICES]]


async def one(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[int]:
    """One request with nothing beside it."""
    return (await collect(submit(engine, prompt, params, request_id="one"))).token_ids


def test_a_seeded_n_call_is_the_same_in_any_batch(
    smollm2_runner: ModelRunner, smollm2_tokenizer: Tokenizer, smollm2_path: Path
) -> None:
    prompt = chat(smollm2_tokenizer, QUESTION)
    companions = [chat(smollm2_tokenizer, text) for text in COMPANIONS]
    engine = engine_on(smollm2_runner, smollm2_tokenizer, step_tokens=2048)
    config = GenerateModelConfig(name="smollm2", kind="generate", path=smollm2_path)
    generator = HostedGenerator(
        config, engine, smollm2_tokenizer, null_generator_metrics(), smollm2_runner.vocab_size, 0
    )
    try:
        together, lasts = asyncio.run(beside_companions(generator, prompt, companions[:4]))
    finally:
        engine.stop()
    chunked = engine_on(smollm2_runner, smollm2_tokenizer, step_tokens=24)
    try:
        apart = asyncio.run(one_by_one(chunked, prompt, companions[3:]))
        alone = asyncio.run(one(chunked, prompt, choice_params(SAMPLED, NUM_CHOICES)[0]))
        assert chunked.stats.num_partial_prefills > 0
    finally:
        chunked.stop()
    assert all(len(tokens) == MAX_TOKENS for tokens in together)
    assert apart == together
    assert alone == together[0]
    # Each choice samples with its own seed, and they shared the prompt's blocks.
    assert len({tuple(tokens) for tokens in together}) == NUM_CHOICES
    assert any(output.num_cached_tokens > 0 for output in lasts)
