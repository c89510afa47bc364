"""Row buckets: the padded row counts of CPU steps, and their warm-up."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conveyor.engine.model import row_buckets
from conveyor.engine.model.row_buckets import (
    EXACT_ROWS,
    PROBE_COUNTS,
    RowCost,
    bucket_sizes,
    choose_padding_limit,
    mean_padding,
    measure_row_costs,
    padded_rows,
    padding_limit,
    probe_rows,
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


def test_the_mean_padding_is_half_a_buckets_width() -> None:
    assert mean_padding(EXACT_ROWS) == 0
    assert mean_padding(65) == 4  # buckets 8 apart from 64 to 128
    assert mean_padding(129) == 8
    assert mean_padding(1025) == 64
    # against every count of a bucket range, padded
    pads = [padded_rows(rows) - rows for rows in range(1025, 2049)]
    assert mean_padding(1025) == pytest.approx(sum(pads) / len(pads), rel=0.02)


def test_probes_are_new_counts_one_past_each_doubling() -> None:
    assert probe_rows(2048) == [65, 129, 257, 513, 1025]
    assert probe_rows(EXACT_ROWS) == []
    assert probe_rows(130) == [65]  # 129 needs room for its PROBE_COUNTS counts
    buckets = set(bucket_sizes(2048)) | {2048}
    for size in probe_rows(2048):
        assert not buckets & set(range(size, size + PROBE_COUNTS))


def _cost(rows: int, generate_ms: float, steady_ms: float) -> RowCost:
    return RowCost(rows, generate_ms / 1e3, steady_ms / 1e3)


def test_padding_pays_up_to_the_last_count_where_a_new_kernel_costs_more() -> None:
    # 30 layers; the padding at 65 rows is 4/65 of a layer's 1 ms each: 1.85 ms
    cheap_kernels = [_cost(65, 2.5, 1.0), _cost(129, 3.0, 1.5), _cost(257, 3.5, 4.0)]
    assert padding_limit(cheap_kernels, 30, 2048) == 129  # 257: 3.5 ms against 7.5
    assert padding_limit(cheap_kernels, 10, 2048) == 2048  # fewer layers: every probe pays
    assert padding_limit([_cost(65, 1.0, 1.0)], 30, 2048) == EXACT_ROWS
    # the first probe that does not pay ends it, whatever comes after
    assert padding_limit([_cost(257, 20, 4), _cost(65, 0.1, 1), _cost(129, 20, 2)], 30, 2048) == (
        EXACT_ROWS
    )
    assert padding_limit([], 30, 2048) == 2048


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Timed(nn.Module):
    """A projection that takes ``row_s`` a row, and 2 ms more the first time it meets a count."""

    def __init__(self, clock: _FakeClock, row_s: float = 1e-6) -> None:
        super().__init__()
        self.row_s = row_s
        self.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self.clock = clock
        self.seen: set[int] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        self.clock.now += rows * self.row_s + (2e-3 if rows not in self.seen else 0.0)
        self.seen.add(rows)
        return x


def test_costs_are_the_first_run_less_a_steady_one_over_new_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(row_buckets.time, "perf_counter", clock)
    module = _Timed(clock)
    costs = measure_row_costs([(module, 4)], [65, 129])
    assert [c.rows for c in costs] == [65, 129]
    for cost in costs:
        assert cost.generate_s == pytest.approx(2e-3)
        assert cost.steady_s == pytest.approx((cost.rows + 1) * 1e-6)  # the median count
    assert module.seen == {65, 66, 67, 129, 130, 131}


def test_the_chosen_limit_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(row_buckets.time, "perf_counter", clock)
    # 2 ms a new count against 30 layers' padding at 3 us a row: pays up to 257, not at 513
    with caplog.at_level("INFO", logger=row_buckets.__name__):
        assert choose_padding_limit([(_Timed(clock, 3e-6), 4)], 30, 600) == 257
    assert "steps padded up to 257 rows" in caplog.text
    assert "257 rows 2.00 / 1.45" in caplog.text and "513 rows 2.00 / 2.89" in caplog.text
