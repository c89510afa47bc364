"""Alternating contenders round by round in one process, and their medians."""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Rounds = dict[str, list[dict[str, float]]]


async def alternate_cases(
    cases: Sequence[str], num_rounds: int, run_case: Callable[[str], Awaitable[dict[str, float]]]
) -> Rounds:
    """Every case once per round, in the same order each round: figures per case."""
    rounds: Rounds = {case: [] for case in cases}
    for _ in range(num_rounds):
        for case in cases:
            rounds[case].append(await run_case(case))
    return rounds


def median_per_case(rounds: Rounds) -> dict[str, Any]:
    """Each case's median of every figure its rounds report."""
    return {
        case: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for case, runs in rounds.items()
    }
