"""Decode buckets: contiguous, covering, and of least cost (checked against brute force)."""

from __future__ import annotations

import itertools
import random

import pytest

from conveyor.engine.model.decode_buckets import MAX_DISTINCT_WIDTHS, plan_decode_buckets


def _cost(blocks: list[int], buckets: list[tuple[int, int]], per_bucket: float) -> float:
    return sum((end - start) * blocks[end - 1] + per_bucket for start, end in buckets)


def _brute_force(blocks: list[int], per_bucket: float) -> float:
    """Least cost over every way to cut the sorted rows."""
    best = float("inf")
    for mask in itertools.product((False, True), repeat=len(blocks) - 1):
        cuts = [0, *(i + 1 for i, cut in enumerate(mask) if cut), len(blocks)]
        best = min(best, _cost(blocks, list(itertools.pairwise(cuts)), per_bucket))
    return best


def test_no_rows_no_buckets() -> None:
    assert plan_decode_buckets([], 8.0) == []


def test_equal_lengths_share_one_bucket() -> None:
    assert plan_decode_buckets([5, 5, 5], 0.0) == [(0, 3)]


def test_a_costly_call_keeps_one_bucket_a_cheap_one_splits_far_lengths() -> None:
    assert plan_decode_buckets([1, 2, 40, 41], 1000.0) == [(0, 4)]
    assert plan_decode_buckets([1, 2, 40, 41], 5.0) == [(0, 2), (2, 4)]


def test_unsorted_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="sorted"):
        plan_decode_buckets([3, 1], 1.0)


@pytest.mark.parametrize("seed", range(40))
def test_plan_is_a_least_cost_partition(seed: int) -> None:
    rng = random.Random(seed)
    blocks = sorted(rng.randint(1, 30) for _ in range(rng.randint(1, 10)))
    per_bucket = rng.choice([0.0, 1.0, 4.0, 16.0, 100.0])
    buckets = plan_decode_buckets(blocks, per_bucket)
    assert buckets[0][0] == 0 and buckets[-1][1] == len(blocks)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(buckets))
    assert _cost(blocks, buckets, per_bucket) == _brute_force(blocks, per_bucket)


def test_many_distinct_lengths_are_planned_on_a_coarser_grid() -> None:
    rng = random.Random(0)
    blocks = sorted(rng.randint(1, 4000) for _ in range(1000))
    buckets = plan_decode_buckets(blocks, 32.0)
    assert buckets[0][0] == 0 and buckets[-1][1] == len(blocks)
    assert len(buckets) <= MAX_DISTINCT_WIDTHS
    # Each bucket pads its rows to its longest; the grid costs little over the real blocks.
    assert _cost(blocks, buckets, 0.0) < 1.1 * sum(blocks)
