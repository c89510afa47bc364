"""SQLite job store: one file, WAL journal, stdlib `sqlite3`.

One connection per store instance, shared by the instance's threads under a lock. Several
instances or processes may open the same file: every write runs in `BEGIN IMMEDIATE`, which
takes SQLite's single write lock up front (waiting up to the busy timeout), so a claim's
read-then-update can never interleave with another writer.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from conveyor.stores.errors import StoreError, StoreUnavailableError
from conveyor.stores.migrations import apply_migrations
from conveyor.stores.sql_queries import Dialect
from conveyor.stores.sql_store import SqlJobStore

SQLITE_URL_PREFIX = "sqlite://"
MEMORY_PATH = ":memory:"
DEFAULT_BUSY_TIMEOUT_MS = 10_000
# Primary result codes meaning "the file cannot serve now", not "the statement is wrong":
# busy or locked past the busy timeout, out of memory, read-only, I/O error, disk full,
# cannot open, lock protocol error.
UNAVAILABLE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def is_unavailable(exc: sqlite3.Error) -> bool:
    """Whether a driver error means the database file cannot serve now (wait and retry)."""
    code = getattr(exc, "sqlite_errorcode", None)
    # Extended codes (e.g. SQLITE_IOERR_WRITE) carry the primary code in their low byte.
    return isinstance(code, int) and (code & 0xFF) in UNAVAILABLE_CODES


def translate(exc: sqlite3.Error, context: str) -> StoreError:
    """The store error for a driver error: unavailable (503) or a plain failure."""
    if is_unavailable(exc):
        return StoreUnavailableError(f"sqlite unavailable: {context}{exc}")
    return StoreError(f"sqlite: {context}{exc}")


class _SqliteSession:
    """`SqlSession` over a sqlite3 connection (autocommit mode; transactions are explicit)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        """Wrap `conn`, which the caller keeps locked for the session's lifetime."""
        self._conn = conn

    def query(self, sql: str, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """Run a statement that returns rows and return all of them."""
        # Fetch everything now: an unfinished statement would block COMMIT.
        return self._conn.execute(sql, params).fetchall()

    def execute(self, sql: str, params: Mapping[str, object]) -> int:
        """Run a statement and return the number of rows it changed."""
        return self._conn.execute(sql, params).rowcount

    def execute_many(self, sql: str, rows: Sequence[Mapping[str, object]]) -> None:
        """Run one statement once per parameter set."""
        self._conn.executemany(sql, rows)


class SqliteJobStore(SqlJobStore):
    """Job store in a SQLite database file (or `:memory:` for throwaway use)."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS):
        """Open `path` (creating parent directories), configure it and apply migrations."""
        super().__init__(Dialect.SQLITE)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = _connect(str(path), busy_timeout_ms)
        try:
            with self._session(is_write=True) as session:
                apply_migrations(session, Dialect.SQLITE)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_url(cls, url: str) -> SqliteJobStore:
        """Open `sqlite:///abs/path.db`, `sqlite://relative/path.db` or `sqlite://:memory:`."""
        return cls(sqlite_path_from_url(url))

    @contextmanager
    def _session(self, *, is_write: bool) -> Iterator[_SqliteSession]:
        """Yield a session; a write session is one `BEGIN IMMEDIATE` transaction."""
        with self._lock:
            conn = self._require_open()
            try:
                if is_write:
                    conn.execute("BEGIN IMMEDIATE")
                try:
                    yield _SqliteSession(conn)
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                if is_write:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise translate(exc, "") from exc

    def _require_open(self) -> sqlite3.Connection:
        """Return the connection or fail if the store was closed."""
        if self._conn is None:
            raise StoreError("job store is closed")
        return self._conn

    def close(self) -> None:
        """Close the connection; later calls raise StoreError. Safe to call twice."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def sqlite_path_from_url(url: str) -> str:
    """Return the filesystem path (or `:memory:`) named by a `sqlite://` URL."""
    if not url.startswith(SQLITE_URL_PREFIX):
        raise ValueError(f"not a sqlite URL: {url!r}")
    path = unquote(url[len(SQLITE_URL_PREFIX) :])
    if path in ("", MEMORY_PATH, "/" + MEMORY_PATH):
        return MEMORY_PATH
    return path


def _connect(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open and configure a connection; translate failures into StoreError."""
    if busy_timeout_ms < 0:
        raise ValueError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
    if path != MEMORY_PATH:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        # isolation_level=None: the module must not open transactions behind our back;
        # check_same_thread=False: the instance lock serialises use across threads.
        conn = sqlite3.connect(
            path,
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if path != MEMORY_PATH:
            # WAL lets readers proceed while a writer commits; FULL syncs each commit so an
            # acknowledged batch or shard commit survives power loss.
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as exc:
        raise translate(exc, f"cannot open {path}: ") from exc
    return conn
