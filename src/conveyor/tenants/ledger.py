"""The online usage ledger: requests' usage summed in memory, written to the job store often.

Online requests end on the event loop; their usage is folded into a tally (per tenant, model
and minute) and a named task writes the tally every `flush_every_s` in one transaction, and
once more when the ledger stops. A write that fails gives its rows back to the tally, so a
store outage delays usage but loses none (only a crash loses the last second's). Batch lines
do not come here: their usage commits with their shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from conveyor.stores.protocols import UsageStore
from conveyor.tenants.usage import UsageEvent, UsageTally

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 1.0


class UsageLedger:
    """A `UsageRecorder` for online requests that flushes to a `UsageStore` while started."""

    def __init__(self, *, flush_every_s: float = FLUSH_EVERY_S) -> None:
        """Nothing is written before `start`."""
        if flush_every_s <= 0:
            raise ValueError(f"flush_every_s must be > 0, got {flush_every_s}")
        self.flush_every_s = flush_every_s
        self._tally = UsageTally()
        self._store: UsageStore | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()

    @property
    def num_pending_rows(self) -> int:
        """Rows waiting for the next flush."""
        return len(self._tally)

    def record(self, event: UsageEvent, now_s: float) -> None:
        """Fold one request in (event loop only; no I/O)."""
        self._tally.record(event, now_s)

    def start(self, store: UsageStore) -> None:
        """Begin writing to `store` every `flush_every_s` (on the running loop)."""
        self._store = store
        self._stop.clear()
        self._task = asyncio.create_task(self._run(), name="conveyor-usage-ledger")

    async def stop(self) -> None:
        """Stop the task and write what is left (shielded from cancellation)."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.shield(self.flush())

    async def flush(self) -> int:
        """Write the tally now; return the rows written (0 when failed or not started)."""
        store = self._store
        if store is None or not len(self._tally):
            return 0
        async with self._flush_lock:
            rows = self._tally.take()
            try:
                await asyncio.to_thread(store.add_usage, rows)
            except Exception as exc:  # a loop boundary: keep the rows, try next time
                self._tally.add_all(rows)
                log.warning("usage flush of %d rows failed, will retry: %s", len(rows), exc)
                return 0
            return len(rows)

    async def _run(self) -> None:
        """Flush every `flush_every_s` until stopped."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.flush_every_s)
            await self.flush()
