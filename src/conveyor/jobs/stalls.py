"""Storage failures met by the background loops: counted, logged, shown on the batch.

A batch whose shards or finalization fail because a store cannot serve (a full disk, an
unreachable database) is stalled, not broken: the loops back off and retry, and the batch
resumes by itself when the store returns. Meanwhile every failed attempt is one log line and
one count in `conveyor_store_errors_total{store,operation}`; the process counts the batches it
sees stalled in `conveyor_batches_stalled{store,reason}` (`reason` is `disk_full` or
`unavailable`); and, where the job store can still be written, the batch's `errors` holds one
`<store>_unavailable` entry saying so and since when (the dashboard shows it). The entry and
the count go once the batch moves again (a shard commits, the batch starts or is finalized).

Blocking methods touch the job store: call them from a thread.
"""

from __future__ import annotations

import errno
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.errors import StoreUnavailable
from conveyor.jobs.context import JobsContext
from conveyor.stores.errors import ObjectStoreError, StoreError
from conveyor.stores.records import BatchError, BatchStatus

log = logging.getLogger(__name__)

LOCAL_DISK = "local_disk"
STORES = ("job_store", "object_store", LOCAL_DISK)
# The local disk (spooled shard records) failing in a way that waiting can fix.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
SQLITE_FULL = 13  # sqlite3.SQLITE_FULL: "database or disk is full"
POSTGRES_DISK_FULL = "53100"  # SQLSTATE disk_full
DISK_FULL, UNAVAILABLE = "disk_full", "unavailable"
STALL_REASONS = (DISK_FULL, UNAVAILABLE)
STALL_CODES = frozenset(f"{s}_unavailable" for s in STORES)
# Only a running batch is noted: a finished one's errors belong to its validation.
NOTED_STATUSES = (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING)
BACKOFF_MAX_S = 5.0


@dataclass(frozen=True, slots=True)
class Stall:
    """Why a batch cannot move, and since when (unix seconds)."""

    store: str
    reason: str
    since: float


def failed_store(exc: BaseException) -> str | None:
    """The store a failure happened in (`job_store`, `object_store`, `local_disk`), or None."""
    if isinstance(exc, StoreUnavailable):
        return exc.store_name
    if isinstance(exc, StoreError):
        return "job_store"
    if isinstance(exc, ObjectStoreError):
        return "object_store"
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        return LOCAL_DISK
    return None


def is_outage(exc: BaseException) -> bool:
    """Whether a failure is a store that cannot serve now (worth a note on the batch)."""
    return isinstance(exc, StoreUnavailable) or failed_store(exc) == LOCAL_DISK


def stall_reason(exc: BaseException) -> str:
    """`disk_full` when the failure, or one it was raised from, is a full disk or quota (an
    OSError, SQLite's SQLITE_FULL, PostgreSQL's disk_full), else `unavailable`."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in NO_SPACE_ERRNOS:
            return DISK_FULL
        if getattr(current, "sqlite_errorcode", None) == SQLITE_FULL:
            return DISK_FULL
        if getattr(current, "sqlstate", None) == POSTGRES_DISK_FULL:
            return DISK_FULL
        current = current.__cause__ or current.__context__
    return UNAVAILABLE


def backoff_s(num_failures: int, base_s: float, max_s: float = BACKOFF_MAX_S) -> float:
    """The wait after `num_failures` failures in a row: doubling from `base_s`, capped."""
    if num_failures < 1:
        return base_s
    return min(base_s * 2.0 ** min(num_failures - 1, 30), max(base_s, max_s))


def stall_note(store: str, operation: str, exc: BaseException, since: float) -> BatchError:
    """The batch `errors` entry of a batch stalled by `store` since `since`."""
    state = "full" if stall_reason(exc) == DISK_FULL else "unavailable"
    return BatchError(
        f"{store}_unavailable",
        f"stalled: the {store.replace('_', ' ')} is {state} ({operation}: {exc}); "
        "retrying until it recovers",
        since=int(since),
    )


def without_stall_notes(errors: Sequence[BatchError] | None) -> list[BatchError] | None:
    """`errors` without stall entries (None when nothing else is left)."""
    kept = [e for e in errors or () if e.code not in STALL_CODES]
    return kept or None


def stall_counts(stalls: Sequence[Stall]) -> dict[tuple[str, str], int]:
    """Stalled batches per (store, reason), every pair present (0 when none)."""
    found = Counter((s.store, s.reason) for s in stalls)
    return {(store, reason): found[store, reason] for store in STORES for reason in STALL_REASONS}


class StallReporter:
    """Counts, logs and notes storage failures of one process's batch jobs (shared by its loops)."""

    def __init__(self, ctx: JobsContext) -> None:
        """Report through `ctx`'s counters and job store."""
        self._ctx = ctx
        self._stalls: dict[str, Stall] = {}
        self._noted: set[str] = set()

    def failed(self, operation: str, exc: BaseException, batch_id: str | None = None) -> bool:
        """Count and log a failure (one line); False, doing nothing, if it is not storage's.

        An outage met by a batch's own step stalls that batch until it moves again.
        """
        store = failed_store(exc)
        if store is None:
            return False
        self._ctx.counters.store_error(store, operation)
        about = f" of batch {batch_id}" if batch_id else ""
        log.warning("%s%s failed in the %s, will retry: %s", operation, about, store, exc)
        if batch_id is not None and is_outage(exc):
            held = self._stalls.get(batch_id)
            since = self._ctx.clock() if held is None else held.since
            self._stalls[batch_id] = Stall(store, stall_reason(exc), since)
            self._publish()
        return True

    def should_note(self, exc: BaseException) -> bool:
        """Whether to note a failure on its batch: an outage of a store other than the job
        store (which would refuse the note as well)."""
        return is_outage(exc) and failed_store(exc) != "job_store"

    def note(self, batch_id: str, operation: str, exc: BaseException) -> None:
        """Blocking: put a stall entry in the batch's errors (once per store)."""
        store_name = failed_store(exc) or "store"
        held = self._stalls.get(batch_id)
        entry = stall_note(
            store_name, operation, exc, self._ctx.clock() if held is None else held.since
        )
        store = self._ctx.store.blocking
        try:
            batch = store.get_batch_any(batch_id)
            if batch is None or batch.status not in NOTED_STATUSES:
                return
            errors = list(batch.errors or ())
            if all(e.code != entry.code for e in errors):
                store.update_batch_fields(batch_id, errors=[*errors, entry])
        except StoreError as exc_store:
            log.warning("cannot note the stall of batch %s: %s", batch_id, exc_store)
            return
        self._noted.add(batch_id)

    def is_stalled(self, batch_id: str) -> bool:
        """Whether this process saw the batch stalled (or left a stall note on it)."""
        return batch_id in self._stalls or batch_id in self._noted

    def recovered(self, batch_id: str) -> None:
        """Blocking: the batch moves again; drop its stall and its stall notes."""
        self._drop(batch_id)
        store = self._ctx.store.blocking
        try:
            batch = store.get_batch_any(batch_id)
            if batch is not None and batch.status in NOTED_STATUSES and batch.errors:
                kept = without_stall_notes(batch.errors)
                if kept != batch.errors:
                    store.update_batch_fields(batch_id, errors=kept)
        except StoreError as exc:
            log.warning("cannot clear the stall note of batch %s yet: %s", batch_id, exc)
            return
        self._noted.discard(batch_id)

    def forget(self, batch_id: str) -> None:
        """The batch started or finished (a finished one's notes were dropped with it)."""
        self._drop(batch_id)
        self._noted.discard(batch_id)

    def _drop(self, batch_id: str) -> None:
        """No longer count the batch as stalled."""
        if self._stalls.pop(batch_id, None) is not None:
            self._publish()

    def _publish(self) -> None:
        """Set the stalled-batches gauge from what is held now."""
        self._ctx.counters.stalled(stall_counts(list(self._stalls.values())))
