"""Workers that said they are draining: out of this gateway's routing at once.

A worker told to drain (SIGTERM) deregisters, so every gateway drops it at its next
registry read; until then it answers new work with 503 and the ``x-conveyor-draining``
header. A gateway that gets that answer retries the request elsewhere and routes nothing
more to the worker, without waiting for the registry. A worker that comes back under the
same id (a rolling restart) is routable again from its first heartbeat after the mark.

Pure: callers pass the time.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Protocol

from conveyor.observability.logs import log_event

__all__ = ["DRAINING_HEADER", "Drained"]

log = logging.getLogger(__name__)

# On a worker's 503: it is draining (as opposed to loading or overloaded).
DRAINING_HEADER = b"x-conveyor-draining"


class _Beating(Protocol):
    """What the tracker reads of a worker: its id and its last heartbeat."""

    @property
    def worker_id(self) -> str:
        """The registry id."""

    @property
    def last_heartbeat_at(self) -> float:
        """Unix time of its last heartbeat."""


class Drained:
    """The workers that answered with the drain marker, and when."""

    def __init__(self) -> None:
        self._marked_at: dict[str, float] = {}

    @property
    def num_marked(self) -> int:
        """Workers marked now (some may be back at their next check)."""
        return len(self._marked_at)

    def mark(self, worker_id: str, now: float) -> None:
        """``worker_id`` answered that it is draining, at ``now``."""
        if worker_id not in self._marked_at:
            log_event(
                log, logging.INFO, "worker_draining",
                f"worker {worker_id} is draining: no more requests to it", worker_id=worker_id,
            )  # fmt: skip
        self._marked_at[worker_id] = now

    def is_draining(self, worker: _Beating) -> bool:
        """True until a heartbeat newer than the mark (a restarted worker) arrives."""
        marked_at = self._marked_at.get(worker.worker_id)
        if marked_at is None:
            return False
        if worker.last_heartbeat_at > marked_at:
            del self._marked_at[worker.worker_id]
            return False
        return True

    def forget_missing(self, present_ids: Collection[str]) -> None:
        """Drop the marks of workers the registry no longer lists."""
        for worker_id in [w for w in self._marked_at if w not in present_ids]:
            del self._marked_at[worker_id]
