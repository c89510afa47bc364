"""Row buckets: the padded row counts of CPU steps, and their warm-up."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conveyor.engine.model.row_buckets import (
    EXACT_ROWS,
    bucket_sizes,
    padded_rows,
    warm_projections,
)


def test_decode_sized_steps_keep_their_row_count() -> None:
    assert [padded_rows(rows) for rows in range(1, EXACT_ROWS + 1)] == list(
        range(1, EXACT_ROWS + 1)
    )


@pytest.mark.parametrize(
    ("rows", "bucket"),
    [(65, 72), (72, 72), (73, 80), (128, 128), (129, 144), (300, 320), (1025, 1152),
     (2047, 2048), (2048, 2048), (2049, 2304)],
)  # fmt: skip
def test_larger_steps_round_up_to_an_eighth_of_their_power_of_two(rows: int, bucket: int) -> None:
    assert padded_rows(rows) == bucket


def test_padding_is_at_most_an_eighth_and_a_bucket_is_its_own_bucket() -> None:
    for rows in range(1, 5000):
        bucket = padded_rows(rows)
        assert rows <= bucket <= rows * 1.125
        assert padded_rows(bucket) == bucket


def test_the_buckets_cover_every_count_and_stay_few() -> None:
    sizes = bucket_sizes(2048)
    assert sizes == sorted(set(sizes)) and sizes[-1] == 2048
    assert {padded_rows(rows) for rows in range(EXACT_ROWS + 1, 2049)} == set(sizes)
    assert len(sizes) == 8 * int(math.log2(2048 // EXACT_ROWS))  # eight per doubling
    assert bucket_sizes(EXACT_ROWS) == []
    assert bucket_sizes(100)[-1] == 104  # the last one holds max_rows


class _Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)
        self.shapes: list[tuple[tuple[int, ...], torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shapes.append((tuple(x.shape), x.dtype))
        return x


def test_every_part_runs_once_a_bucket_at_its_width_and_dtype() -> None:
    attention, mlp = _Recorder(), _Recorder()
    warm_projections([(attention, 24), (mlp, 8)], [72, 80])
    assert attention.shapes == [((72, 24), torch.bfloat16), ((80, 24), torch.bfloat16)]
    assert mlp.shapes == [((72, 8), torch.bfloat16), ((80, 8), torch.bfloat16)]
