"""The Sampler: greedy, top-k/top-p, seeds, logprobs; the inverse-CDF draw on its own."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.sampling.sampler import Sampler, inverse_cdf, new_generator
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


def test_unseeded_sampling_follows_the_distribution() -> None:
    # Unseeded rows take the inverse-CDF draw: a chi-square test on torch's global generator,
    # seeded here (and restored after) so the test is deterministic.
    probabilities = torch.tensor([0.5, 0.25, 0.0, 0.15, 0.1])
    num_draws = 20_000
    logits = probabilities.log().expand(num_draws, 5)
    params = [SamplingParams(temperature=1.0)] * num_draws
    with torch.random.fork_rng():
        torch.manual_seed(11)
        tokens = Sampler().sample(logits, params, [None] * num_draws).token_ids
    counts = torch.bincount(torch.tensor(tokens), minlength=5).double()
    assert counts[2] == 0
    assert _chi_square(counts, probabilities) < CHI_SQUARE_3_DOF_AT_0_001


def test_unseeded_top_k_top_p_and_min_p_restrict_the_candidates() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).expand(500, 5)
    sampler = Sampler()
    unseeded: list[torch.Generator | None] = [None] * 500
    top_k = sampler.sample(logits, [SamplingParams(top_k=2)] * 500, unseeded)
    assert set(top_k.token_ids) == {0, 1}
    top_p = sampler.sample(logits, [SamplingParams(top_p=0.8)] * 500, unseeded)
    assert set(top_p.token_ids) == {0, 1}
    # min_p 0.3 keeps the tokens at least 0.3x as likely as the top one: 0 and 1 (0.37x).
    min_p = sampler.sample(logits, [SamplingParams(min_p=0.3)] * 500, unseeded)
    assert set(min_p.token_ids) == {0, 1}
    hot = sampler.sample(logits, [SamplingParams(temperature=2.0, top_k=3)] * 500, unseeded)
    assert set(hot.token_ids) == {0, 1, 2}


def test_greedy_rows_beside_random_ones_take_the_exact_argmax() -> None:
    logits = _logits(6, seed=8)
    params = [SamplingParams(temperature=0.0 if row % 2 else 1.0) for row in range(6)]
    generators = [new_generator(row) if row == 4 else None for row in range(6)]
    tokens = Sampler().sample(logits, params, generators).token_ids
    assert tokens[1::2] == logits[1::2].argmax(dim=-1).tolist()


def test_a_seeded_row_ignores_seeded_unseeded_and_greedy_neighbours() -> None:
    row = _logits(1, seed=9)
    mine = SamplingParams(temperature=1.3, seed=5)

    def draw(neighbours: list[SamplingParams], seeds: list[int | None], position: int) -> int:
        others = _logits(len(neighbours), seed=10 + len(neighbours))
        logits = torch.cat([others[:position], row, others[position:]])
        generators = [None if seed is None else new_generator(seed) for seed in seeds]
        generators.insert(position, new_generator(5))
        params = [*neighbours[:position], mine, *neighbours[position:]]
        return Sampler().sample(logits, params, generators).token_ids[position]

    hot = SamplingParams(temperature=1.5)
    alone = draw([], [], 0)
    assert draw([hot, hot, hot], [None, 7, None], 1) == alone
    assert draw([SamplingParams(temperature=0.0), hot], [None, 3], 2) == alone
    assert draw([SamplingParams(top_p=0.5)] * 4, [None] * 4, 0) == alone


# ---------------------------------------------------------------- the inverse-CDF draw

# The chi-square statistic's 0.1 % critical value for 3 degrees of freedom.
CHI_SQUARE_3_DOF_AT_0_001 = 16.27


def _chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    expected = probabilities.double() * counts.sum()
    kept = expected > 0
    return float((((counts - expected) ** 2)[kept] / expected[kept]).sum())


def test_inverse_cdf_draws_follow_the_weights() -> None:
    # Unnormalised weights; the zero-weight token sits between the others.
    weights = torch.tensor([6.0, 3.0, 0.0, 2.0, 1.0])
    num_draws = 20_000
    uniforms = torch.rand(
        num_draws, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    tokens = inverse_cdf(weights.expand(num_draws, 5), uniforms)
    counts = torch.bincount(tokens, minlength=5).double()
    assert counts[2] == 0
    assert _chi_square(counts, weights / weights.sum()) < CHI_SQUARE_3_DOF_AT_0_001


def test_inverse_cdf_picks_at_the_edges() -> None:
    weights = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]])
    below_one = math.nextafter(1.0, 0.0)

    def pick(u: float) -> int:
        return int(inverse_cdf(weights, torch.tensor([u], dtype=torch.float64))[0])

    assert pick(0.0) == 1  # not the zero-weight token 0
    assert pick(math.nextafter(1 / 3, 0.0)) == 1
    assert pick(1 / 3) == 3  # not the zero-weight token 2 at the step
    assert pick(below_one) == 3  # not the zero-weight token 4 past the last step
    # A target at the total, as rounding could give, takes the last token of positive
    # weight (searchsorted alone would answer 5, past the end).
    assert pick(1.0) == 3


def test_inverse_cdf_top_draw_never_picks_zero_weight_tails() -> None:
    # The top float32 and float64 uniforms, and 1.0 for a product that rounds up to the
    # total, over rows whose last positive token is followed by zero-weight tokens and
    # whole zero-weight blocks; the weights' float32 block sums round.
    generator = torch.Generator().manual_seed(4)
    weights = torch.rand(64, 1700, generator=generator)
    weights[weights < 0.7] = 0.0
    weights[:, 900:] = 0.0
    last_positive = [int(row.nonzero()[-1]) for row in weights]
    for top in (math.nextafter(1.0, 0.0), 1.0 - 2.0**-24, 1.0):
        tokens = inverse_cdf(weights, torch.full((64,), top, dtype=torch.float64))
        assert tokens.tolist() == last_positive


def test_inverse_cdf_across_blocks_follows_the_weights() -> None:
    # Tokens at both ends of the first blocks, a block of zero weight, a short last block.
    vocab_size = 1700
    weights = torch.zeros(vocab_size)
    weights[[3, 511, 512, 1699]] = torch.tensor([4.0, 3.0, 2.0, 1.0])
    num_draws = 20_000
    generator = torch.Generator().manual_seed(5)
    uniforms = torch.rand(num_draws, dtype=torch.float64, generator=generator)
    tokens = inverse_cdf(weights.expand(num_draws, vocab_size), uniforms)
    counts = torch.bincount(tokens, minlength=vocab_size).double()
    assert counts.sum() == counts[[3, 511, 512, 1699]].sum()
    expected = weights[[3, 511, 512, 1699]] / weights.sum()
    assert _chi_square(counts[[3, 511, 512, 1699]], expected) < CHI_SQUARE_3_DOF_AT_0_001


def test_inverse_cdf_keeps_the_share_of_a_tiny_token() -> None:
    # Shares of 1e-9 beside a weight of 1: lost to float32 rounding of a running sum (in
    # float32, 1 + 1e-9 == 1), kept here, in the first token's block and in a later block.
    weights = torch.zeros(1, 1500)
    weights[0, [0, 5, 1400]] = torch.tensor([1.0, 1e-9, 1e-9])
    total = 1.0 + 2e-9

    def pick(u: float) -> int:
        return int(inverse_cdf(weights, torch.tensor([u], dtype=torch.float64))[0])

    assert pick(0.5) == 0
    assert pick((1.0 + 0.5e-9) / total) == 5
    assert pick((1.0 + 1.5e-9) / total) == 1400


def test_inverse_cdf_of_a_row_without_weight_gives_token_zero() -> None:
    # A row nothing is allowed in (all weights 0) stays in range rather than past the end.
    tokens = inverse_cdf(torch.zeros(2, 4), torch.tensor([0.0, 0.9], dtype=torch.float64))
    assert tokens.tolist() == [0, 0]


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
