"""Row-count buckets for CPU steps whose projections run through oneDNN.

oneDNN generates (JIT) a matmul kernel for every new row count of a packed projection and
keeps the last 1,024 in its primitive cache. A step's row count is its token count, so
mixed steps (a prompt plus the decodes riding along) bring a new one almost every time:
with SmolLM2 on 2 cores a new count cost 1-2 ms a projection shape at a hundred rows and
6-18 ms at a thousand, and a step of one prompt of 64-600 tokens and eight decodes took
95-98 ms the first time its count came and 78-84 ms the next (medians of 40, ad-hoc). With
every count from 1 to 2,048 possible, a busy server also cycles the cache.

So an eager CPU step is padded up to a bucket: every count up to ``EXACT_ROWS`` (decode
steps; small counts are cheap to generate and soon all seen), then eight buckets per
doubling, which wastes at most an eighth of the rows (``padded_rows``). SmolLM2's step of
2,048 tokens has about a hundred buckets in all, and ``warm_projections`` generates every
bucket's kernels above ``EXACT_ROWS`` at start-up, off any request's path.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["EXACT_ROWS", "bucket_sizes", "padded_rows", "warm_projections"]

# Row counts kept as they are (decode steps up to this many sequences).
EXACT_ROWS = 64
# Buckets between one power of two and the next.
STEPS_PER_DOUBLING = 8


def padded_rows(rows: int) -> int:
    """The bucket of a step of ``rows`` rows: ``rows`` itself up to ``EXACT_ROWS``; above,
    the next multiple of an eighth of the power of two below it (at most 1/8 padding)."""
    if rows <= EXACT_ROWS:
        return rows
    below = 1 << ((rows - 1).bit_length() - 1)  # the largest power of two under rows
    step = below // STEPS_PER_DOUBLING
    return -(-rows // step) * step


def bucket_sizes(max_rows: int) -> list[int]:
    """The padded buckets a step of ``EXACT_ROWS + 1`` to ``max_rows`` rows can land in,
    ascending (the last one at least ``max_rows``)."""
    sizes = []
    rows = EXACT_ROWS + 1
    while rows <= max_rows:
        sizes.append(padded_rows(rows))
        rows = sizes[-1] + 1
    return sizes


def warm_projections(parts: Iterable[tuple[nn.Module, int]], buckets: Iterable[int]) -> None:
    """Run each part (a projection or an MLP, with its input width) once on zeros of every
    bucket's row count, so that oneDNN generates their kernels now."""
    parts = list(parts)
    with torch.inference_mode():
        for rows in buckets:
            for module, width in parts:
                weight = next(module.parameters())
                module(torch.zeros(rows, width, dtype=weight.dtype, device=weight.device))
