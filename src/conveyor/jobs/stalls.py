"""Storage failures met by the background loops: counted, logged, shown on the batch.

A batch whose shards or finalization fail because a store cannot serve (a full disk, an
unreachable database) is stalled, not broken: the loops back off and retry, and the batch
resumes by itself when the store returns. Meanwhile every failed attempt is one log line and
one count in `conveyor_store_errors_total{store,operation}`, and, where the job store can
still be written, the batch's `errors` holds one `<store>_unavailable` entry saying so. The
entry goes once the batch moves again (a shard commits, or the batch is finalized).

Blocking methods touch the job store: call them from a thread.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Sequence

from conveyor.errors import StoreUnavailable
from conveyor.jobs.context import JobsContext
from conveyor.stores.errors import ObjectStoreError, StoreError
from conveyor.stores.records import BatchError, BatchStatus

log = logging.getLogger(__name__)

LOCAL_DISK = "local_disk"
# The local disk (spooled shard records) failing in a way that waiting can fix.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
STALL_CODES = frozenset(f"{s}_unavailable" for s in ("job_store", "object_store", LOCAL_DISK))
# Only a running batch is noted: a finished one's errors belong to its validation.
NOTED_STATUSES = (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING)
BACKOFF_MAX_S = 5.0


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


def backoff_s(num_failures: int, base_s: float, max_s: float = BACKOFF_MAX_S) -> float:
    """The wait after `num_failures` failures in a row: doubling from `base_s`, capped."""
    if num_failures < 1:
        return base_s
    return min(base_s * 2.0 ** min(num_failures - 1, 30), max(base_s, max_s))


def stall_note(store: str, operation: str, exc: BaseException) -> BatchError:
    """The batch `errors` entry of a batch stalled by `store`."""
    return BatchError(
        f"{store}_unavailable",
        f"stalled: {operation} failed in the {store.replace('_', ' ')} ({exc}); "
        "retrying until it recovers",
    )


def without_stall_notes(errors: Sequence[BatchError] | None) -> list[BatchError] | None:
    """`errors` without stall entries (None when nothing else is left)."""
    kept = [e for e in errors or () if e.code not in STALL_CODES]
    return kept or None


class StallReporter:
    """Counts, logs and notes storage failures of one process's batch jobs (shared by its loops)."""

    def __init__(self, ctx: JobsContext) -> None:
        """Report through `ctx`'s counters and job store."""
        self._ctx = ctx
        self._noted: set[str] = set()

    def failed(self, operation: str, exc: BaseException, batch_id: str | None = None) -> bool:
        """Count and log a failure (one line); False, doing nothing, if it is not storage's."""
        store = failed_store(exc)
        if store is None:
            return False
        self._ctx.counters.store_error(store, operation)
        about = f" of batch {batch_id}" if batch_id else ""
        log.warning("%s%s failed in the %s, will retry: %s", operation, about, store, exc)
        return True

    def should_note(self, exc: BaseException) -> bool:
        """Whether to note a failure on its batch: an outage of a store other than the job
        store (which would refuse the note as well)."""
        return is_outage(exc) and failed_store(exc) != "job_store"

    def note(self, batch_id: str, operation: str, exc: BaseException) -> None:
        """Blocking: put a stall entry in the batch's errors (once per store)."""
        store_name = failed_store(exc) or "store"
        entry = stall_note(store_name, operation, exc)
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

    def is_noted(self, batch_id: str) -> bool:
        """Whether this process left a stall note on the batch."""
        return batch_id in self._noted

    def recovered(self, batch_id: str) -> None:
        """Blocking: drop the stall notes of a batch that moves again."""
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
        """The batch finished (its notes were dropped with it)."""
        self._noted.discard(batch_id)
