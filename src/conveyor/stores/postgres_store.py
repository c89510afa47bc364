"""PostgreSQL job store over psycopg 3, with a small built-in connection pool.

Connections run in autocommit mode; a write session wraps its statements in one explicit
transaction. Shard claims lock their candidate row with `FOR UPDATE SKIP LOCKED`, so any number
of workers (threads, processes, hosts) can claim concurrently without handing out a shard twice.

No call waits forever (see `PostgresTimeouts`): connecting, waiting for a pooled connection,
and every round trip are bounded, so an unreachable or frozen server surfaces within seconds
as `StoreUnavailableError` (the API's 503) instead of a hang.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from conveyor.stores.errors import StoreError, StoreUnavailableError
from conveyor.stores.migrations import apply_migrations
from conveyor.stores.sql_queries import Dialect
from conveyor.stores.sql_schema import LOCK_FOR_MIGRATION
from conveyor.stores.sql_store import SqlJobStore
from conveyor.stores.timeouts import PostgresTimeouts

_R = TypeVar("_R")

DEFAULT_MAX_CONNECTIONS = 4
# Idle pooled connections to a vanished host are found dead within about 5 + 3 * 1 s.
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_COUNT = 3
WAIT_INTERVAL_S = 0.1
# Arbitrary constant naming the advisory lock that serialises schema migrations.
MIGRATION_LOCK_KEY = 0x636F6E76  # "conv"


def connect_params(url: str, timeouts: PostgresTimeouts) -> dict[str, Any]:
    """libpq parameters: those of `url`, plus the timeouts where the URL sets none.

    TCP keepalives and `tcp_user_timeout` are set too, so the kernel notices a dead peer.
    """
    params: dict[str, Any] = conninfo_to_dict(url)
    defaults = {
        "connect_timeout": timeouts.connect_timeout_s,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE_S,
        "keepalives_interval": KEEPALIVE_INTERVAL_S,
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": int(timeouts.round_trip_timeout_s * 1000),
    }
    for name, value in defaults.items():
        params.setdefault(name, value)
    # Earlier `-c` settings lose to later ones, so an explicit one in the URL wins.
    statement = f"-c statement_timeout={timeouts.statement_timeout_ms}"
    params["options"] = f"{statement} {params.get('options', '')}".strip()
    return params


def is_unavailable(exc: psycopg.Error) -> bool:
    """Whether a driver error means the server cannot serve now (wait and retry), not a bug.

    Connection failures and timeouts, cancelled statements (statement_timeout), a server
    shutting down or out of disk, memory or connections, lock timeouts: all
    `OperationalError`s except a statement too large for the server, which no wait fixes.
    """
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, psycopg.errors.ProgramLimitExceeded
    )


class TimedConnection(psycopg.Connection[tuple[Any, ...]]):
    """A connection whose every round trip is bounded by `round_trip_timeout_s`.

    Past the bound the connection is closed (its state is unknown) and the call raises an
    `OperationalError`, so a frozen server cannot hold a thread forever. None: no bound.
    """

    round_trip_timeout_s: float | None = None

    def wait(
        self, gen: PQGen[_R], interval: float = WAIT_INTERVAL_S, timeout: float | None = None
    ) -> _R:
        """Consume `gen` like psycopg does, but never for longer than the bound."""
        bound_s = timeout if timeout is not None else self.round_trip_timeout_s
        started = time.monotonic()
        try:
            return super().wait(gen, interval, bound_s)
        except psycopg.OperationalError:
            if bound_s is not None and time.monotonic() - started >= bound_s:
                self.pgconn.finish()  # do not send ROLLBACK into a connection that hangs
            raise


Connection = TimedConnection


class _ConnectionPool:
    """At most `max_size` autocommit connections, reused most-recent first.

    A connection that is broken or left inside a transaction is closed instead of reused.
    """

    def __init__(self, conninfo: str, max_size: int, timeouts: PostgresTimeouts) -> None:
        """Remember how to connect; connections are opened lazily on first use."""
        if max_size < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_size}")
        self._params = connect_params(conninfo, timeouts)
        self._timeouts = timeouts
        self._acquire_timeout_s = timeouts.acquire_timeout_s
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._is_closed = False

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """Lend a connection for the duration of the block."""
        if not self._slots.acquire(timeout=self._acquire_timeout_s):
            raise StoreUnavailableError(
                f"postgres: no connection free within {self._acquire_timeout_s} s"
            )
        try:
            conn = self._take_idle() or self._connect()
            try:
                yield conn
            finally:
                self._give_back(conn)
        finally:
            self._slots.release()

    def _take_idle(self) -> Connection | None:
        """Pop a reusable idle connection, if any."""
        with self._lock:
            if self._is_closed:
                raise StoreError("job store is closed")
            return self._idle.pop() if self._idle else None

    def _connect(self) -> Connection:
        """Open a new autocommit connection with bounded round trips."""
        conn = TimedConnection.connect(autocommit=True, **self._params)
        conn.round_trip_timeout_s = self._timeouts.round_trip_timeout_s
        return conn

    def _give_back(self, conn: Connection) -> None:
        """Return a healthy idle connection to the pool; close anything else."""
        is_reusable = (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == TransactionStatus.IDLE
        )
        with self._lock:
            if is_reusable and not self._is_closed:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close idle connections; lent ones are closed when given back."""
        with self._lock:
            self._is_closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _PostgresSession:
    """`SqlSession` over one psycopg connection."""

    def __init__(self, conn: Connection) -> None:
        """Wrap a connection lent by the pool."""
        self._conn = conn

    def query(self, sql: str, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """Run a statement that returns rows and return all of them."""
        with self._conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    def execute(self, sql: str, params: Mapping[str, object]) -> int:
        """Run a statement and return the number of rows it changed."""
        with self._conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.rowcount

    def execute_many(self, sql: str, rows: Sequence[Mapping[str, object]]) -> None:
        """Run one statement once per parameter set (pipelined by psycopg)."""
        with self._conn.cursor() as cur:
            cur.executemany(sql, rows)


class PostgresJobStore(SqlJobStore):
    """Job store in a PostgreSQL database named by a libpq URL."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeouts: PostgresTimeouts | None = None,
    ) -> None:
        """Connect lazily through a small pool and apply migrations now."""
        super().__init__(Dialect.POSTGRES)
        self._pool = _ConnectionPool(url, max_connections, timeouts or PostgresTimeouts())
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    def _migrate(self) -> None:
        """Apply pending migrations, without the statement timeouts (an index build is slow)."""
        with self._session(is_write=True, is_bounded=False) as session:
            session.execute("SET LOCAL statement_timeout = 0", {})
            # Concurrent openers queue here instead of racing on CREATE TABLE.
            session.query(
                LOCK_FOR_MIGRATION.text(Dialect.POSTGRES), {"lock_key": MIGRATION_LOCK_KEY}
            )
            apply_migrations(session, Dialect.POSTGRES)

    @contextmanager
    def _session(self, *, is_write: bool, is_bounded: bool = True) -> Iterator[_PostgresSession]:
        """Yield a session; a write session is one transaction, rolled back on error."""
        try:
            with self._pool.connection() as conn:
                bound_s = conn.round_trip_timeout_s
                if not is_bounded:
                    conn.round_trip_timeout_s = None
                try:
                    if is_write:
                        with conn.transaction():
                            yield _PostgresSession(conn)
                    else:
                        yield _PostgresSession(conn)
                finally:
                    conn.round_trip_timeout_s = bound_s
        except psycopg.Error as exc:
            if is_unavailable(exc):
                raise StoreUnavailableError(f"postgres unavailable: {exc}") from exc
            raise StoreError(f"postgres: {exc}") from exc

    def close(self) -> None:
        """Close pooled connections; later calls raise StoreError. Safe to call twice."""
        self._pool.close()
