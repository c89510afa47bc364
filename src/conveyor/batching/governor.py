"""Out-of-memory backoff: halve the batch cap, remember it, probe back up later."""

from __future__ import annotations

import threading


class BatchSizeGovernor:
    """The largest batch the model is currently trusted with.

    After an out-of-memory error at size n the cap becomes n // 2. Once
    ``probe_interval_s`` passes without another OOM the cap doubles (up to
    ``max_batch_size``), so a transient squeeze does not cost throughput forever.
    Shared by the event loop (reads) and the model thread (writes), hence the lock.
    """

    def __init__(self, max_batch_size: int, *, probe_interval_s: float = 30.0) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if probe_interval_s <= 0:
            raise ValueError("probe_interval_s must be positive")
        self.max_batch_size = max_batch_size
        self.probe_interval_s = probe_interval_s
        self._cap = max_batch_size
        self._last_change_at = 0.0
        self._lock = threading.Lock()

    @property
    def is_backed_off(self) -> bool:
        """True while the cap is below the configured maximum."""
        return self._cap < self.max_batch_size

    def cap(self, now: float) -> int:
        """The cap at ``now``, after any probe-up that is due."""
        with self._lock:
            if (
                self._cap < self.max_batch_size
                and now - self._last_change_at >= self.probe_interval_s
            ):
                self._cap = min(self.max_batch_size, self._cap * 2)
                self._last_change_at = now
            return self._cap

    def on_oom(self, batch_size: int, now: float) -> int:
        """Record an OOM at ``batch_size``; returns the new cap."""
        with self._lock:
            self._cap = max(1, min(self._cap, batch_size // 2))
            self._last_change_at = now
            return self._cap
