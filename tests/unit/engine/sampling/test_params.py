"""SamplingParams validation: every bad field is named; lists become tuples."""

from __future__ import annotations

import math
from typing import Any

import pytest

from conveyor.engine.sampling.params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"stop": "END"}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": True}, "prompt_logprobs"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_invalid_params_name_the_field(kwargs: dict[str, Any], field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name):
        SamplingParams(**kwargs)


def test_lists_are_stored_as_tuples_and_params_are_hashable() -> None:
    params = SamplingParams(stop=["a", "b"], stop_token_ids=[5], logprobs=0, top_k=-1)
    assert params.stop == ("a", "b")
    # A set, looked up once per generated token (a list was scanned whole: with the 3M ids a
    # body may carry, each token cost seconds on the engine thread).
    assert params.stop_token_ids == frozenset({5})
    assert SamplingParams(stop_token_ids=[7, 5, 7]).stop_token_ids == frozenset({5, 7})
    assert hash(params) == hash(
        SamplingParams(stop=("a", "b"), stop_token_ids=(5,), logprobs=0, top_k=-1)
    )


def test_max_tokens_0_is_a_prompt_only_request() -> None:
    params = SamplingParams(max_tokens=0, prompt_logprobs=0)
    assert (params.max_tokens, params.prompt_logprobs) == (0, 0)
