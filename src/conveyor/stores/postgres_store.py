"""PostgreSQL job store over psycopg 3, with a small built-in connection pool.

Connections run in autocommit mode; a write session wraps its statements in one explicit
transaction. Shard claims lock their candidate row with `FOR UPDATE SKIP LOCKED`, so any number
of workers (threads, processes, hosts) can claim concurrently without handing out a shard twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from conveyor.stores.job_store import SqlJobStore, StoreError
from conveyor.stores.migrations import apply_migrations
from conveyor.stores.sql_queries import LOCK_FOR_MIGRATION, Dialect

Connection = psycopg.Connection[tuple[Any, ...]]

DEFAULT_MAX_CONNECTIONS = 4
DEFAULT_ACQUIRE_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10
# Arbitrary constant naming the advisory lock that serialises schema migrations.
MIGRATION_LOCK_KEY = 0x636F6E76  # "conv"


class _ConnectionPool:
    """At most `max_size` autocommit connections, reused most-recent first.

    A connection that is broken or left inside a transaction is closed instead of reused.
    """

    def __init__(
        self, conninfo: str, max_size: int, acquire_timeout_s: float, connect_timeout_s: int
    ) -> None:
        """Remember how to connect; connections are opened lazily on first use."""
        if max_size < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_size}")
        self._conninfo = conninfo
        self._acquire_timeout_s = acquire_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._is_closed = False

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """Lend a connection for the duration of the block."""
        if not self._slots.acquire(timeout=self._acquire_timeout_s):
            raise StoreError(f"no database connection free within {self._acquire_timeout_s} s")
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
        """Open a new autocommit connection."""
        return psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=self._connect_timeout_s
        )

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
        acquire_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
        connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        """Connect lazily through a small pool and apply migrations now."""
        super().__init__(Dialect.POSTGRES)
        self._pool = _ConnectionPool(url, max_connections, acquire_timeout_s, connect_timeout_s)
        try:
            with self._session(is_write=True) as session:
                # Concurrent openers queue here instead of racing on CREATE TABLE.
                session.query(
                    LOCK_FOR_MIGRATION.text(Dialect.POSTGRES), {"lock_key": MIGRATION_LOCK_KEY}
                )
                apply_migrations(session, Dialect.POSTGRES)
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _session(self, *, is_write: bool) -> Iterator[_PostgresSession]:
        """Yield a session; a write session is one transaction, rolled back on error."""
        try:
            with self._pool.connection() as conn:
                if is_write:
                    with conn.transaction():
                        yield _PostgresSession(conn)
                else:
                    yield _PostgresSession(conn)
        except psycopg.Error as exc:
            raise StoreError(f"postgres: {exc}") from exc

    def close(self) -> None:
        """Close pooled connections; later calls raise StoreError. Safe to call twice."""
        self._pool.close()
