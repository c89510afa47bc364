"""hf_static's static batches and the token times each of its requests gets."""

from __future__ import annotations

import pytest
from bench.served_hf_static import batch_sizes, batch_token_times


def test_requests_form_full_batches_of_the_concurrency_and_a_rest() -> None:
    assert batch_sizes(64, 16) == [16, 16, 16, 16]
    assert batch_sizes(64, 64) == [64]
    assert batch_sizes(10, 4) == [4, 4, 2]
    assert batch_sizes(3, 16) == [3]


def test_every_request_of_a_batch_gets_its_tokens_at_the_batch_steps() -> None:
    times = batch_token_times(10.0, [10.5, 10.6, 10.8], size=2)
    assert len(times) == 2
    for request in times:
        assert request == pytest.approx([0.5, 0.6, 0.8])
    times[0].append(1.0)  # each request owns its list
    assert len(times[1]) == 3
