"""How long a prompt's prefill takes at least, from the engine's recent steps (torch-free).

A prompt of P uncached tokens is prefilled in steps of at most the token budget B, so it
needs at least P // B full steps, and a full step takes at least as long as any step that
computed between B/2 and B tokens. The bound kept is the fastest such step of the last
``RECENT_STEPS``: the fastest, not the mean, so a stalled step never makes a prompt look
slower than it is. A prompt whose bound already passes its deadline cannot meet it on this
device whatever else runs, so it is refused at admission with a 400 (``DeadlineTooShort``):
retrying with the same deadline can never help, unlike the 429 of a load that drains.

Pure bookkeeping with an injected clock; the engine thread observes its steps and asks
when it takes a request.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.sequence import Sequence
from conveyor.errors import DeadlineTooShort

# Steps of at least half the budget remembered: a device that got slower is seen within
# this many prefill steps, one that got faster at once.
RECENT_STEPS = 32


class PrefillTime:
    """Recent steps that computed at least half their token budget, and their times."""

    def __init__(
        self, window: int = RECENT_STEPS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)
        self._clock = clock

    def observe(self, num_tokens: int, budget: int, seconds: float) -> None:
        """Record a step of ``num_tokens`` under a budget of ``budget`` (smaller ones
        bound nothing and are not kept)."""
        if 2 * num_tokens >= budget:
            self._steps.append((num_tokens, seconds))

    def min_prefill_s(self, num_tokens: int, budget: int) -> float | None:
        """At least how long ``num_tokens`` take to prefill alone in steps of ``budget``
        tokens; None while no recent step of between half the budget and it was seen."""
        full_steps_s = [seconds for n, seconds in self._steps if budget <= 2 * n <= 2 * budget]
        if not full_steps_s:
            return None
        return (num_tokens // budget) * min(full_steps_s)

    def refusal(
        self, seq: Sequence, scheduler: Scheduler, deadline_s: float | None
    ) -> DeadlineTooShort | None:
        """``check_prefill`` for the tokens of ``seq``, not yet queued on ``scheduler``,
        that its prefix cache lacks, due by ``deadline_s`` (on ``clock``; None: never)."""
        if deadline_s is None:
            return None
        num_tokens = seq.num_tokens - scheduler.block_manager.num_cache_hit_tokens(seq)
        time_left_s = deadline_s - self._clock()
        return check_prefill(self, num_tokens, scheduler.token_budget, time_left_s=time_left_s)


def check_prefill(
    timing: PrefillTime, num_tokens: int, budget: int, *, time_left_s: float
) -> DeadlineTooShort | None:
    """The refusal for a prompt of ``num_tokens`` uncached tokens whose prefill alone takes
    longer than ``time_left_s``; None when it may meet its deadline."""
    prefill_s = timing.min_prefill_s(num_tokens, budget)
    if prefill_s is None or prefill_s <= time_left_s:
        return None
    return DeadlineTooShort(
        f"the prompt's {num_tokens} uncached tokens take at least {prefill_s:.1f} s to "
        f"prefill on this model, longer than the request's deadline ({time_left_s:.1f} s "
        "left); send a longer X-Conveyor-Timeout-Ms or a shorter prompt"
    )
