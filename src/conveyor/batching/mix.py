"""How big a batch that holds online inputs may be while batch-job inputs wait too.

Online inputs always go first. Topping their batch up with job inputs uses the model
better, but makes the online callers wait for a bigger batch. So a batch holding online
inputs takes job inputs only while the predicted batch time grows by at most
``max_topup_s``; job inputs otherwise run in full batches of their own. An online caller
then waits at most for one job batch already running plus a batch barely longer than
its own. Pure arithmetic on the fitted batch-time model.
"""

from __future__ import annotations

from conveyor.batching.timing import BatchTimeModel


def online_batch_limit(
    num_online: int, cap: int, timing: BatchTimeModel, *, max_topup_s: float
) -> int:
    """The most inputs a batch holding ``num_online`` online inputs may take.

    Without online inputs, or with as many as a batch holds, that is ``cap``. Before the
    batch-time model is warm nothing is known of the cost, so no job input is added.
    """
    if num_online <= 0 or num_online >= cap:
        return cap
    if not timing.is_warm:
        return num_online
    per_input_s = (timing.seconds_for(cap) - timing.seconds_for(1)) / max(1, cap - 1)
    if per_input_s <= 0:
        return cap  # a bigger batch costs nothing more: fill it
    extra = int(max_topup_s / per_input_s)
    return min(cap, num_online + extra)
