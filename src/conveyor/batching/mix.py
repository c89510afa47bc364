"""How big a batch may be while online callers and a batch job share one model.

Online inputs always go first in a batch; job inputs fill the rest. An online caller may
arrive just after a batch was launched, so it waits for that batch and then for its own.
While online traffic is present and job inputs wait, every batch is therefore capped at
the size whose predicted time, plus `SPREADS` times the fit's recent spread, is half of
(a one-input batch + a full batch + a slack): the two batches an online caller can wait
for then take no longer than the batch it would run in on an idle model plus one full
batch plus the slack, even when both run long (batches of one size differ by their
texts' lengths and by what else the machine does; the bound is for the slowest callers,
the p99, not the typical one). Without online traffic the job runs full batches. Pure
arithmetic on the fitted batch-time model.
"""

from __future__ import annotations

from conveyor.batching.timing import BatchTimeModel

# Room each of the two waits leaves, in spreads (root mean square errors of the fit): with
# about normal errors, two waits with two spreads of room each keep over 99% of callers
# within the bound (their summed error is 1.4 spreads wide; the room is 4 spreads).
SPREADS = 2.0


def mixed_batch_limit(cap: int, timing: BatchTimeModel, *, slack_s: float) -> int:
    """The largest batch, at most ``cap``, whose predicted time is within the budget.

    Before the batch-time model is warm nothing is known of the cost: ``cap``. While only
    one batch size has been seen, the slope is unknown and cost is taken as proportional
    to size (the cautious guess); the smaller batches that follow teach the real slope.
    """
    if cap <= 1 or not timing.is_warm:
        return cap
    full_s = timing.seconds_for(cap)
    if timing.has_slope:
        one_s, per_input_s = timing.seconds_for(1), timing.seconds_per_input()
    else:
        per_input_s = full_s / cap
        one_s = per_input_s
    if per_input_s <= 0:
        return cap  # a bigger batch costs nothing more: fill it
    budget_s = (one_s + full_s + slack_s) / 2 - SPREADS * timing.spread_s
    size = 1 + int((budget_s - one_s) / per_input_s)
    return max(1, min(cap, size))
