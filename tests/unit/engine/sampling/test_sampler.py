"""The Sampler: greedy, top-k/top-p, seeds, logprobs."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.sampling.sampler import Sampler, new_generator
from conveyor.fakes.checkpoints import build_tiny_llama, torch_threads

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

VOCAB_SIZE = 50


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def _logits(num_rows: int, seed: int) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB_SIZE, generator=torch.Generator().manual_seed(seed)) * 3


# ---------------------------------------------------------------- choosing tokens


def test_greedy_is_exact_argmax() -> None:
    logits = _logits(8, seed=1)
    result = Sampler().sample(logits, [SamplingParams(temperature=0.0)] * 8, [None] * 8)
    assert result.token_ids == logits.argmax(dim=-1).tolist()
    assert result.logprobs == [None] * 8


def test_top_k_one_equals_greedy_even_when_hot() -> None:
    logits = _logits(8, seed=2)
    params = [SamplingParams(temperature=5.0, top_k=1)] * 8
    assert Sampler().sample(logits, params, [None] * 8).token_ids == logits.argmax(-1).tolist()


def test_same_seed_gives_same_tokens_whatever_the_neighbours() -> None:
    sampler = Sampler()
    mine = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=1234)
    row = _logits(1, seed=3)

    def run(num_neighbours: int, position: int, neighbour_seed: int) -> list[int]:
        generator = new_generator(1234)
        tokens = []
        for step in range(20):
            others = _logits(num_neighbours, seed=neighbour_seed + step)
            logits = torch.cat([others[:position], row, others[position:]])
            params = [SamplingParams(temperature=0.7, top_k=5)] * num_neighbours
            params.insert(position, mine)
            generators: list[torch.Generator | None] = [None] * num_neighbours
            generators.insert(position, generator)
            tokens.append(sampler.sample(logits, params, generators).token_ids[position])
        return tokens

    alone = run(0, 0, 0)
    assert run(5, 2, 100) == alone
    assert run(9, 9, 200) == alone
    assert len(set(alone)) > 1  # really sampled, not stuck on one token


def test_different_seeds_differ() -> None:
    logits = torch.zeros(1, VOCAB_SIZE)  # uniform: any token is equally likely
    params = [SamplingParams(temperature=1.0)]

    def draw(seed: int) -> list[int]:
        generator = new_generator(seed)
        return [Sampler().sample(logits, params, [generator]).token_ids[0] for _ in range(10)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_sampling_follows_the_distribution() -> None:
    probabilities = torch.tensor([0.6, 0.3, 0.1])
    num_draws = 4000
    logits = probabilities.log().expand(num_draws, 3)
    generator = new_generator(7)
    params = [SamplingParams(temperature=1.0)] * num_draws
    tokens = Sampler().sample(logits, params, [generator] * num_draws).token_ids
    frequencies = torch.bincount(torch.tensor(tokens), minlength=3).float() / num_draws
    torch.testing.assert_close(frequencies, probabilities, atol=0.03, rtol=0)


def test_tokens_of_zero_probability_are_never_drawn() -> None:
    # Unseeded and seeded rows alike; the zero-mass tokens sit first, between and last.
    num_draws = 2000
    logits = torch.tensor([[-math.inf, 0.0, -math.inf, 0.0, -math.inf]]).expand(num_draws, 5)
    params = [SamplingParams(temperature=1.0)] * num_draws
    generators = [None if row % 2 else new_generator(row) for row in range(num_draws)]
    tokens = Sampler().sample(logits, params, generators).token_ids
    counts = torch.bincount(torch.tensor(tokens), minlength=5)
    assert counts[[0, 2, 4]].sum() == 0
    assert abs(int(counts[1]) - num_draws // 2) < 150


def test_top_k_and_top_p_restrict_the_candidates() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).expand(500, 5)
    generator = new_generator(3)
    sampler = Sampler()
    top_k = sampler.sample(logits, [SamplingParams(top_k=2)] * 500, [generator] * 500)
    assert set(top_k.token_ids) == {0, 1}
    # Softmax of the logits is about [0.64, 0.24, 0.09, 0.03, 0.01]: top_p 0.8 keeps 2 tokens.
    top_p = sampler.sample(logits, [SamplingParams(top_p=0.8)] * 500, [generator] * 500)
    assert set(top_p.token_ids) == {0, 1}
    tiny_p = sampler.sample(logits, [SamplingParams(top_p=0.01)] * 500, [generator] * 500)
    assert set(tiny_p.token_ids) == {0}


def test_logprobs_of_the_raw_distribution() -> None:
    logits = _logits(3, seed=4)
    params = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=2.0, logprobs=0, seed=1),
    ]
    result = Sampler().sample(logits, params, [None, None, new_generator(1)])
    expected = torch.log_softmax(logits, dim=-1)
    first = result.logprobs[0]
    assert first is not None
    assert first.token_id == result.token_ids[0]
    assert first.logprob == pytest.approx(float(expected[0].max()))
    top_ids = [token for token, _ in first.top]
    assert top_ids == expected[0].topk(3).indices.tolist()
    assert [value for _, value in first.top] == pytest.approx(expected[0].topk(3).values.tolist())
    assert result.logprobs[1] is None
    third = result.logprobs[2]
    assert third is not None and third.top == ()
    assert third.logprob == pytest.approx(float(expected[2, result.token_ids[2]]))


def test_mismatched_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="one params"):
        Sampler().sample(_logits(2, seed=5), [SamplingParams()], [None])


def test_seeded_request_is_reproducible_through_the_model(tmp_path: Path) -> None:
    # The same seeded request, alone and in a batch with others, yields the same tokens.
    runner = ModelRunner(build_tiny_llama(tmp_path), num_kv_blocks=64, block_size=4, device="cpu")
    sampler = Sampler()
    prompt = (5, 17, 99, 250, 3, 42)
    mine = SamplingParams(temperature=1.0, seed=99)

    def generate(neighbours: list[tuple[int, ...]]) -> list[int]:
        prompts = [*neighbours, prompt]
        tables = [tuple(range(8 * i, 8 * i + 8)) for i in range(len(prompts))]
        chunks = [SeqChunk(p, 0, t, True) for p, t in zip(prompts, tables, strict=True)]
        generators: list[torch.Generator | None] = [None] * len(neighbours)
        generators.append(new_generator(99))
        params = [SamplingParams(temperature=1.0)] * len(neighbours) + [mine]
        tokens: list[list[int]] = [[] for _ in prompts]
        for _ in range(12):
            chosen = sampler.sample(runner.execute(chunks), params, generators).token_ids
            chunks = [
                SeqChunk((token,), chunk.end_pos, chunk.block_table, True)
                for chunk, token in zip(chunks, chosen, strict=True)
            ]
            for seq_tokens, token in zip(tokens, chosen, strict=True):
                seq_tokens.append(token)
        return tokens[-1]

    alone = generate([])
    assert generate([(7, 8, 9), (100,) * 11, (300, 301)]) == alone
