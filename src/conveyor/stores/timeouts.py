"""How long the PostgreSQL job store waits before calling the server unavailable.

Kept free of the driver so settings can build it without importing psycopg.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ACQUIRE_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 3  # libpq's minimum is 2 s
DEFAULT_STATEMENT_TIMEOUT_MS = 3_000
# The client gives up on a round trip this long after the server's own statement_timeout would
# have answered: a healthy server cancels first, so only a lost or frozen one trips the client.
CLIENT_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class PostgresTimeouts:
    """How long the job store waits on PostgreSQL before calling it unavailable.

    - `connect_timeout_s`: opening a connection (libpq `connect_timeout`, at least 2 s);
    - `statement_timeout_ms`: the server cancels a statement running longer (migrations are
      exempt); the client also abandons a round trip with no answer `CLIENT_GRACE_S` later,
      which is what catches a frozen server or network;
    - `acquire_timeout_s`: waiting for a free pooled connection.

    Parameters given in the store URL win over these.
    """

    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS
    acquire_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S

    def __post_init__(self) -> None:
        """Reject timeouts that would mean "wait forever" or never succeed."""
        if self.connect_timeout_s < 2:
            raise ValueError(f"connect_timeout_s must be >= 2, got {self.connect_timeout_s}")
        if self.statement_timeout_ms < 1:
            raise ValueError(f"statement_timeout_ms must be >= 1, got {self.statement_timeout_ms}")
        if self.acquire_timeout_s <= 0:
            raise ValueError(f"acquire_timeout_s must be > 0, got {self.acquire_timeout_s}")

    @property
    def round_trip_timeout_s(self) -> float:
        """How long the client waits for any one answer before dropping the connection."""
        return self.statement_timeout_ms / 1000 + CLIENT_GRACE_S
