"""Group a step's decode rows by context length, so attention reads each row's real context.

Decode rows attend in batched calls, each padded to its longest row. One call for the whole
step pads every row to the step's longest context; one call per row pays a call's fixed
cost per row. The plan in between: sort rows by context length (in blocks) and cut the
sorted list into contiguous buckets, choosing the cuts that minimise

    sum over buckets of (rows in bucket x blocks of its longest row) + bucket_cost_blocks

— blocks read (padding included) plus a fixed cost per call, in block-equivalents. Pure
logic, torch-free: the model runner turns the plan into tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_DISTINCT_WIDTHS", "plan_decode_buckets"]

# Block counts are rounded up to a grid of at most this many widths, which bounds the
# search at about MAX_DISTINCT_WIDTHS**2 / 2 steps (well under a millisecond).
MAX_DISTINCT_WIDTHS = 64


def plan_decode_buckets(
    sorted_num_blocks: Sequence[int], bucket_cost_blocks: float
) -> list[tuple[int, int]]:
    """Cut rows sorted by block count (ascending) into ``[start, end)`` buckets of least cost.

    Exact dynamic programming over the distinct block counts: a bucket always ends after
    the last row of some count. No plan of the rows before a bucket costs less than their
    own blocks, so the search back from each cut stops once that bound plus the bucket's
    cost reaches the best found. Counts are first rounded up to a grid of at most
    ``MAX_DISTINCT_WIDTHS`` widths (exact for contexts up to that many blocks).
    """
    if any(b > a for a, b in zip(sorted_num_blocks[1:], sorted_num_blocks, strict=False)):
        raise ValueError("block counts must be sorted ascending")
    # ends[k]: one past the last row of the k-th distinct count; values[k]: that count.
    ends: list[int] = []
    values: list[int] = []
    grid = -(-max(sorted_num_blocks, default=1) // MAX_DISTINCT_WIDTHS)
    for row, exact in enumerate(sorted_num_blocks):
        count = -(-exact // grid) * grid
        if values and values[-1] == count:
            ends[-1] = row + 1
        else:
            values.append(count)
            ends.append(row + 1)
    starts = [0, *ends]  # starts[k]: first row of the k-th distinct count
    real = [0]  # real[k]: blocks of rows [0, starts[k]) without padding
    for k, value in enumerate(values):
        real.append(real[-1] + (ends[k] - starts[k]) * value)
    best = [0.0] * (len(ends) + 1)  # best[k]: least cost of rows [0, starts[k])
    cut = [0] * (len(ends) + 1)  # cut[k]: where the last bucket of best[k] starts
    for k in range(1, len(ends) + 1):
        width = values[k - 1]
        best[k] = float("inf")
        for i in range(k - 1, -1, -1):
            padded = (ends[k - 1] - starts[i]) * width + bucket_cost_blocks
            if real[i] + padded >= best[k]:
                break  # a wider bucket pads a row more than the row itself costs before
            if best[i] + padded < best[k]:
                best[k], cut[k] = best[i] + padded, i
    buckets: list[tuple[int, int]] = []
    k = len(ends)
    while k > 0:
        buckets.append((starts[cut[k]], ends[k - 1]))
        k = cut[k]
    return buckets[::-1]
