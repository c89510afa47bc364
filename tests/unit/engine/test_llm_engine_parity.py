"""Greedy output through the whole engine (scheduler, runner, sampler, loop thread) must
equal Hugging Face ``generate`` token for token, however the engine batches the work:
alone, 32 at once, under preemption, on prefix-cache hits and with chunked prefill."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.engine.llm_engine import EngineConfig
from conveyor.engine.sampling.params import SamplingParams
from tests.unit.model_helpers import (
    HFReference,
    Result,
    engine_config,
    generate,
    random_prompts,
    running_engine,
    wait_idle,
)

# `model`: runs a real (tiny) torch model, so mutation runs leave it out.
pytestmark = [pytest.mark.anyio, pytest.mark.model]

VOCAB_SIZE = 512


@dataclass
class Model:
    """A checkpoint and its Hugging Face reference."""

    path: Path
    reference: HFReference


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(
    request: pytest.FixtureRequest, llama_path: Path, qwen3_path: Path, llama_reference: HFReference
) -> Model:
    if request.param == "llama":
        return Model(llama_path, llama_reference)
    return Model(qwen3_path, HFReference(qwen3_path))


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy decoding for ``max_tokens`` tokens."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


async def run_and_compare(
    model: Model, config: EngineConfig, prompts: list[list[int]], max_tokens: list[int]
) -> tuple[list[Result], dict[str, int]]:
    """Generate through a fresh engine, assert parity and a whole pool; return stats."""
    with running_engine(model.path, config) as engine:
        results = await generate(engine, prompts, [greedy(n) for n in max_tokens])
        await wait_idle(engine)
        assert engine.num_used_blocks == 0
        stats = {
            "preemptions": engine.stats.num_preemptions,
            "hits": engine.stats.num_prefix_cache_hit_tokens,
            "partial_prefills": engine.stats.num_partial_prefills,
            "max_running": engine.stats.max_num_running,
        }
    for prompt, n, result in zip(prompts, max_tokens, results, strict=True):
        assert result.token_ids == model.reference.generate(prompt, n), f"prompt {prompt}"
    return results, stats


async def test_one_request_alone(model: Model) -> None:
    prompt = random_prompts([13], VOCAB_SIZE, seed=1)
    await run_and_compare(model, engine_config(), prompt, [16])


async def test_32_concurrent_requests_of_mixed_lengths(model: Model) -> None:
    rng = random.Random(2)
    lengths = [rng.randint(1, 60) for _ in range(32)]
    max_tokens = [rng.randint(1, 16) for _ in range(32)]
    prompts = random_prompts(lengths, VOCAB_SIZE, seed=2)
    _, stats = await run_and_compare(model, engine_config(), prompts, max_tokens)
    assert stats["max_running"] > 16  # they really shared steps


async def test_preemption_under_a_small_kv_budget(model: Model) -> None:
    # 8 requests of up to 40 tokens need ~80 blocks of 4; the pool has 20 (one max_model_len).
    config = engine_config(num_kv_blocks=20, max_model_len=80, max_num_seqs=8)
    prompts = random_prompts([20, 24, 18, 22, 26, 19, 21, 23], VOCAB_SIZE, seed=3)
    _, stats = await run_and_compare(model, config, prompts, [16] * len(prompts))
    assert stats["preemptions"] > 0


async def test_prefix_cache_hits(model: Model) -> None:
    prefix = random_prompts([32], VOCAB_SIZE, seed=4)[0]
    suffixes = random_prompts([3, 5, 7, 9], VOCAB_SIZE, seed=5)
    prompts = [prefix + suffix for suffix in suffixes]
    config = engine_config()
    with running_engine(model.path, config) as engine:
        # The first request fills the cache; the others, sent after it, share its prefix.
        first = await generate(engine, prompts[:1], greedy(8))
        rest = await generate(engine, prompts[1:], greedy(8))
        await wait_idle(engine)
        assert engine.stats.num_prefix_cache_hit_tokens >= 3 * 32
        assert engine.num_used_blocks == 0
    for prompt, result in zip(prompts, first + rest, strict=True):
        assert result.token_ids == model.reference.generate(prompt, 8)


async def test_chunked_prefill(model: Model) -> None:
    config = engine_config(max_num_batched_tokens=8, max_num_seqs=4)
    prompts = random_prompts([30, 45, 17, 50], VOCAB_SIZE, seed=6)
    _, stats = await run_and_compare(model, config, prompts, [10] * len(prompts))
    assert stats["partial_prefills"] > 0
