"""The size limit of a batch that holds online inputs while job inputs wait."""

from __future__ import annotations

import pytest

from conveyor.batching.mix import online_batch_limit
from conveyor.batching.timing import BatchTimeModel


def fitted(
    fixed_s: float, per_input_s: float, sizes: tuple[int, ...] = (1, 50, 100)
) -> BatchTimeModel:
    model = BatchTimeModel()
    for _ in range(4):
        for size in sizes:
            model.observe(size, fixed_s + per_input_s * size)
    return model


def test_without_online_inputs_the_batch_is_full() -> None:
    assert online_batch_limit(0, 100, fitted(0.02, 0.0003), max_topup_s=0.005) == 100


def test_online_inputs_are_topped_up_only_within_the_allowed_extra_time() -> None:
    # 0.3 ms an input: 5 ms more buys 16 job inputs beside the 2 online ones.
    assert online_batch_limit(2, 100, fitted(0.02, 0.0003), max_topup_s=0.005) == 18


def test_a_zero_allowance_keeps_online_batches_pure() -> None:
    assert online_batch_limit(3, 100, fitted(0.02, 0.0003), max_topup_s=0.0) == 3


def test_as_many_online_inputs_as_a_batch_holds_fill_it() -> None:
    assert online_batch_limit(100, 100, fitted(0.02, 0.0003), max_topup_s=0.0) == 100
    assert online_batch_limit(150, 100, fitted(0.02, 0.0003), max_topup_s=0.0) == 100


def test_the_limit_never_exceeds_the_cap() -> None:
    assert online_batch_limit(2, 10, fitted(0.02, 0.0003), max_topup_s=1.0) == 10


def test_a_cold_model_adds_no_job_input() -> None:
    assert online_batch_limit(2, 100, BatchTimeModel(), max_topup_s=0.005) == 2


def test_free_extra_inputs_fill_the_batch() -> None:
    constant = fitted(0.02, 0.0)
    assert online_batch_limit(2, 100, constant, max_topup_s=0.0) == 100


def test_a_single_online_input_is_topped_up_by_the_fitted_cost_of_one_input() -> None:
    # 10 ms + 1 ms an input: 2.5 ms more buys 2 job inputs beside the online one.
    small = fitted(0.01, 0.001, sizes=(1, 2, 3, 4))
    assert online_batch_limit(1, 4, small, max_topup_s=0.0025) == 3


@pytest.mark.parametrize(("max_topup_s", "limit"), [(0.0006, 1), (0.0015, 2)])
def test_a_batch_of_two_takes_a_job_input_only_if_one_input_fits_the_allowance(
    max_topup_s: float, limit: int
) -> None:
    pair = fitted(0.01, 0.001, sizes=(1, 2))
    assert online_batch_limit(1, 2, pair, max_topup_s=max_topup_s) == limit
