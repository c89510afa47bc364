"""Plans held steady on the dashboard: made once, remade only when their inputs move.

A plan made from what a model measures (its batch times, its mean prompt and output
lengths) would move from poll to poll with those figures. Each model's plan is kept with
the inputs it was made from and the time it was made; it is remade only when an input has
moved by more than ``DRIFT`` of its value, and the page says when the plan was made.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

DRIFT = 0.25
Plan = dict[str, Any]


@dataclass(frozen=True, slots=True)
class HeldPlan:
    """A plan, the inputs it was made from, and when."""

    inputs: tuple[float, ...]
    plan: Plan | None
    made_at: float


def has_drifted(held: Sequence[float], now: Sequence[float], drift: float = DRIFT) -> bool:
    """Whether any input moved by more than ``drift`` of the larger of its two values."""
    if len(held) != len(now):
        return True
    return any(
        abs(a - b) > drift * max(abs(a), abs(b), 1e-12) for a, b in zip(held, now, strict=True)
    )


class PlanBoard:
    """Every model's held plan, in one process."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._held: dict[str, HeldPlan] = {}
        self._lock = threading.Lock()

    def plan(
        self, model: str, inputs: tuple[float, ...], make: Callable[[], Plan | None]
    ) -> Plan | None:
        """The held plan of ``model`` with its ``planned_at``; ``make()`` it again when it
        is missing or its inputs drifted."""
        with self._lock:
            held = self._held.get(model)
            if held is None or has_drifted(held.inputs, inputs):
                held = HeldPlan(inputs, make(), self._clock())
                self._held[model] = held
        if held.plan is None:
            return None
        return {**held.plan, "planned_at": held.made_at}


_BOARDS: weakref.WeakKeyDictionary[Any, PlanBoard] = weakref.WeakKeyDictionary()


def board_of(owner: Any) -> PlanBoard:
    """The board of ``owner`` (a service): made on first use, gone with it."""
    board = _BOARDS.get(owner)
    if board is None:
        board = _BOARDS.setdefault(owner, PlanBoard())
    return board
