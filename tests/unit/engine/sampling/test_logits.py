"""Logit shaping in the sampler: logit_bias, repeat penalties, min-p and a grammar's mask."""

from __future__ import annotations

import pytest
import torch

from conveyor.engine.sampling.logits import TokenHistory
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.sampling.sampler import Sampler, new_generator

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

GREEDY = SamplingParams(temperature=0.0)


def _logits() -> torch.Tensor:
    return torch.tensor([[3.0, 2.0, 1.0, -1.0, 0.5]])


def test_logit_bias_can_force_and_forbid_tokens() -> None:
    params = SamplingParams(temperature=0.0, logit_bias=[(3, 100.0)])
    assert Sampler().sample(_logits(), [params], [None]).token_ids == [3]
    params = SamplingParams(temperature=0.0, logit_bias=[(0, -100.0)])
    assert Sampler().sample(_logits(), [params], [None]).token_ids == [1]


def test_presence_and_frequency_penalties_count_only_output_tokens() -> None:
    history = TokenHistory(token_ids=[0, 1, 1], num_prompt_tokens=1)  # output: [1, 1]
    frequency = SamplingParams(temperature=0.0, frequency_penalty=0.6)
    presence = SamplingParams(temperature=0.0, presence_penalty=1.5)
    logits = torch.tensor([[1.0, 2.0, 0.9, 0.0, 0.0]])
    sampler = Sampler()
    # token 1 loses 1.2 (two uses) and falls below token 0, which is only in the prompt
    assert sampler.sample(logits, [frequency], [None], histories=[history]).token_ids == [0]
    assert sampler.sample(logits, [presence], [None], histories=[history]).token_ids == [0]
    assert sampler.sample(logits, [GREEDY], [None], histories=[history]).token_ids == [1]


def test_repetition_penalty_covers_the_prompt_and_both_signs() -> None:
    history = TokenHistory(token_ids=[0, 3], num_prompt_tokens=2)
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    logits = torch.tensor([[3.0, 2.0, 1.0, -1.0, 0.5]])
    result = Sampler().sample(logits, [params], [None], histories=[history])
    assert result.token_ids == [1]  # 3.0 / 2 = 1.5 < 2.0


def test_min_p_drops_unlikely_tokens() -> None:
    logits = torch.tensor([[5.0, 4.9, -5.0, -5.0, -5.0]])
    params = SamplingParams(temperature=1.0, min_p=0.5, seed=0)
    picks = {
        Sampler().sample(logits, [params], [new_generator(seed)]).token_ids[0]
        for seed in range(200)
    }
    assert picks == {0, 1}


def test_a_mask_restricts_greedy_and_sampled_rows_alike() -> None:
    allowed = torch.tensor([[False, False, True, True, False]] * 2)
    params = [GREEDY, SamplingParams(temperature=1.5)]
    for _ in range(20):
        picks = Sampler().sample(_logits().repeat(2, 1), params, [None, None], allowed=allowed)
        assert set(picks.token_ids) <= {2, 3}
    # logprobs stay those of the raw distribution
    logprob_params = SamplingParams(temperature=0.0, logprobs=0)
    result = Sampler().sample(_logits(), [logprob_params], [None], allowed=allowed[:1])
    raw = torch.log_softmax(_logits(), dim=-1)[0, 2].item()
    assert result.logprobs[0] is not None and abs(result.logprobs[0].logprob - raw) < 1e-6
