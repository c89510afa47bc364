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

Whether padding pays depends on the CPU. Where oneDNN drives AMX tiles, generating a kernel
costs more than the matmul itself; on an AMD EPYC with AVX512-BF16 a new count cost 2-6 ms
a layer's projections while the padding of a step of a thousand rows cost about 15 ms (30
layers of 1/16 more rows). So ``measure_row_costs`` times a layer's projections on a few
row counts not seen before, first and again, and ``padding_limit`` keeps padding only up to
the largest of those counts where generating the kernels costs more than padding.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "EXACT_ROWS",
    "RowCost",
    "bucket_sizes",
    "choose_padding_limit",
    "mean_padding",
    "measure_row_costs",
    "padded_rows",
    "padding_limit",
    "probe_rows",
    "warm_projections",
]

log = logging.getLogger(__name__)

# Row counts kept as they are (decode steps up to this many sequences).
EXACT_ROWS = 64
# Buckets between one power of two and the next.
STEPS_PER_DOUBLING = 8
# New row counts timed per probed size (their medians are taken), and steady runs of each.
PROBE_COUNTS = 3
STEADY_RUNS = 2


@dataclass(frozen=True)
class RowCost:
    """What a new row count costs a layer's projections, in seconds: ``generate_s`` for
    oneDNN's kernels (its first run less a later one), ``steady_s`` a run once they exist."""

    rows: int
    generate_s: float
    steady_s: float

    def padding_s(self, layers: int) -> float:
        """What padding a step of about ``rows`` rows costs ``layers`` such layers: their
        steady run on the mean padding there (``mean_padding``)."""
        return layers * self.steady_s * mean_padding(self.rows) / self.rows


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
                module(_zeros(module, width, rows))


def _zeros(module: nn.Module, width: int, rows: int) -> torch.Tensor:
    """An input of ``rows`` rows of zeros for ``module`` (its weight's dtype and device)."""
    weight = next(module.parameters())
    return torch.zeros(rows, width, dtype=weight.dtype, device=weight.device)


def mean_padding(rows: int) -> float:
    """The mean padding rows of steps in the bucket range of ``rows``: half a bucket's width
    above ``EXACT_ROWS``, none at or below it."""
    if rows <= EXACT_ROWS:
        return 0.0
    below = 1 << ((rows - 1).bit_length() - 1)
    return below / STEPS_PER_DOUBLING / 2


def padding_limit(costs: Sequence[RowCost], layers: int, max_rows: int) -> int:
    """The row count up to which padding steps pays: generating a count's kernels costs more
    than ``layers`` layers of projections on the mean padding there. Probes are taken in
    ascending order: the limit is the last one that pays before the first that does not
    (``EXACT_ROWS`` where the first does not, ``max_rows`` where all do)."""
    limit = EXACT_ROWS
    for cost in sorted(costs, key=lambda c: c.rows):
        if cost.generate_s <= cost.padding_s(layers):
            return limit
        limit = cost.rows
    return max_rows


def probe_rows(max_rows: int) -> list[int]:
    """Row counts to time: one past ``EXACT_ROWS`` times each power of two, up to
    ``max_rows`` (none a bucket, so none generated by the warm-up step or the buckets)."""
    sizes, rows = [], EXACT_ROWS
    while rows + PROBE_COUNTS <= max_rows:
        sizes.append(rows + 1)
        rows *= 2
    return sizes


def _run_s(parts: Sequence[tuple[nn.Module, int]], rows: int) -> float:
    """Seconds of one run of every part on zeros of ``rows`` rows."""
    inputs = [_zeros(module, width, rows) for module, width in parts]
    started_s = time.perf_counter()
    for (module, _), x in zip(parts, inputs, strict=True):
        module(x)
    return time.perf_counter() - started_s


def measure_row_costs(
    parts: Iterable[tuple[nn.Module, int]], sizes: Iterable[int]
) -> list[RowCost]:
    """Time the parts (a layer's projections, with their input widths) on ``PROBE_COUNTS``
    new row counts from each size on: the first run and the best of ``STEADY_RUNS`` more,
    the medians over the counts. Every count must be new to oneDNN (see ``probe_rows``)."""
    parts = list(parts)
    costs = []
    with torch.inference_mode():
        for size in sizes:
            generate, steady = [], []
            for rows in range(size, size + PROBE_COUNTS):
                first_s = _run_s(parts, rows)
                again_s = min(_run_s(parts, rows) for _ in range(STEADY_RUNS))
                generate.append(max(first_s - again_s, 0.0))
                steady.append(again_s)
            costs.append(RowCost(size, statistics.median(generate), statistics.median(steady)))
    return costs


def choose_padding_limit(parts: Sequence[tuple[nn.Module, int]], layers: int, max_rows: int) -> int:
    """Measure (``measure_row_costs``) and decide (``padding_limit``) up to which row count
    steps are padded, and log the measurements."""
    costs = measure_row_costs(parts, probe_rows(max_rows))
    limit = padding_limit(costs, layers, max_rows)
    log.info(
        "row buckets: steps padded up to %d rows (a new count's kernels / the padding of %d "
        "layers, ms: %s)", limit, layers, ", ".join(
            f"{c.rows} rows {c.generate_s * 1e3:.2f} / {c.padding_s(layers) * 1e3:.2f}"
            for c in costs
        ),
    )  # fmt: skip
    return limit
