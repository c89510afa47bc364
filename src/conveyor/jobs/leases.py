"""Job policy: the batch lifecycle, when a lease is live, and when to speculate.

Pure rules, no I/O: the store applies what it is told (a compare-and-set transition, a lease
until a given time) and the jobs package decides with these what to tell it. The SQL store
states the live-lease rule once more in SQL (`stores.sql_queries.live_lease`), because a claim
must test it in the same statement that takes the lease; the shared store tests hold both to
the same answers.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from conveyor.stores.records import BatchStatus

TERMINAL_BATCH_STATUSES: frozenset[BatchStatus] = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)
# Every status a batch can still leave (its input file is still read).
ACTIVE_BATCH_STATUSES: tuple[BatchStatus, ...] = tuple(
    s for s in BatchStatus if s not in TERMINAL_BATCH_STATUSES
)

# Legal lifecycle edges. The store's compare-and-set guards against races; this table guards
# against programming errors such as resurrecting a completed batch.
BATCH_TRANSITIONS: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.VALIDATING: frozenset(
        {BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING}
    ),
    BatchStatus.IN_PROGRESS: frozenset(
        {BatchStatus.FINALIZING, BatchStatus.CANCELLING, BatchStatus.EXPIRED, BatchStatus.FAILED}
    ),
    BatchStatus.FINALIZING: frozenset(
        {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED}
    ),
    BatchStatus.CANCELLING: frozenset({BatchStatus.CANCELLED}),
    BatchStatus.FAILED: frozenset(),
    BatchStatus.COMPLETED: frozenset(),
    BatchStatus.EXPIRED: frozenset(),
    BatchStatus.CANCELLED: frozenset(),
}


def can_transition(from_status: BatchStatus, to_status: BatchStatus) -> bool:
    """Return whether the lifecycle allows moving a batch from `from_status` to `to_status`."""
    return to_status in BATCH_TRANSITIONS[from_status]


def check_transition(from_statuses: Iterable[BatchStatus], to_status: BatchStatus) -> None:
    """Raise ValueError unless every edge `from_statuses` -> `to_status` is in the lifecycle."""
    target = BatchStatus(to_status)
    sources = [BatchStatus(s) for s in from_statuses]
    if not sources:
        raise ValueError("transition needs at least one from-status")
    for source in sources:
        if not can_transition(source, target):
            raise ValueError(f"batch cannot move from {source} to {target}")


def is_live(lease_expires_at: float | None, now: float) -> bool:
    """Whether a lease expiring at `lease_expires_at` still holds at `now`.

    At `now == lease_expires_at` it has expired: another worker may take the shard over, and
    the holder's commit is refused. No expiry (a shard nobody holds) is not a live lease.
    """
    return lease_expires_at is not None and lease_expires_at > now


@dataclass(frozen=True, slots=True)
class SpeculationPolicy:
    """When a running shard is a straggler worth a speculative second run.

    A shard qualifies when it has run longer than `min_running_s` and longer than
    `slow_factor` times the median run time of its batch's committed shards (so a batch
    needs at least one committed shard before anything is speculated).
    """

    slow_factor: float = 3.0
    min_running_s: float = 5.0

    def __post_init__(self) -> None:
        """Reject factors that would speculate on ordinary shards."""
        if self.slow_factor < 1:
            raise ValueError(f"slow_factor must be >= 1, got {self.slow_factor}")
        if self.min_running_s < 0:
            raise ValueError(f"min_running_s must be >= 0, got {self.min_running_s}")

    def is_straggler(self, running_s: float, run_times_s: Sequence[float]) -> bool:
        """Whether a shard running for `running_s` lags its batch's committed `run_times_s`."""
        if not run_times_s or running_s < self.min_running_s:
            return False
        return running_s > self.slow_factor * statistics.median(run_times_s)
