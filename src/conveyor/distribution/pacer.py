"""A byte-rate pacer: how long to wait before sending the next piece, under a rate cap.

Pure apart from its clock: a token bucket that may go into debt. Each reservation takes its
bytes from the bucket and waits until the rate has paid back what it overdrew, so concurrent
senders sharing one pacer share the cap between them. A worker's chunk server uses one to
bound what it uploads to peers (`--peer-upload-mb-s`), so serving chunks does not starve its
own traffic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

PIECE_BYTES = 16 * 1024


class BytePacer:
    """Paces bytes to at most `rate_bytes_s`, allowing a burst of `burst_bytes` after idling."""

    def __init__(
        self,
        rate_bytes_s: float,
        *,
        burst_bytes: int = PIECE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Validate the rate; the pacer starts idle."""
        if rate_bytes_s <= 0 or burst_bytes < 0:
            raise ValueError("rate_bytes_s must be > 0 and burst_bytes >= 0")
        self.rate_bytes_s = rate_bytes_s
        self.burst_bytes = burst_bytes
        self.clock = clock
        self._tokens = float(burst_bytes)
        self._last_s = clock()

    def reserve(self, num_bytes: int) -> float:
        """Reserve `num_bytes` of the rate; return the seconds to wait before sending them."""
        now = self.clock()
        refill = (now - self._last_s) * self.rate_bytes_s
        self._tokens = min(float(self.burst_bytes), self._tokens + refill) - num_bytes
        self._last_s = now
        return max(0.0, -self._tokens / self.rate_bytes_s)

    async def paced(self, pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Yield `pieces`, each after waiting for its share of the rate."""
        async for piece in pieces:
            delay_s = self.reserve(len(piece))
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            yield piece
