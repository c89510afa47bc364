"""The base of the SQL job store: sessions and single-statement helpers, no backend.

A backend (`sqlite_store`, `postgres_store`) subclasses `SqlJobStore` and implements
`_session`: a context manager yielding a `SqlSession`. With `is_write=True` the session is one
transaction holding the database's write lock or row locks as the dialect needs; driver errors
leaving it must be raised as `StoreError` (`StoreUnavailableError` when waiting may help).
The aggregates (`sql_files`, `sql_shards`, `sql_store`) build on this class only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from conveyor.stores.sql_queries import Dialect, Query, SqlSession


class SqlStore(ABC):
    """Runs named queries in sessions its backend provides."""

    def __init__(self, dialect: Dialect) -> None:
        """Remember the dialect used to pick statement texts."""
        self._dialect = dialect

    @property
    def dialect(self) -> Dialect:
        """The SQL dialect this store speaks."""
        return self._dialect

    @abstractmethod
    def _session(self, *, is_write: bool) -> AbstractContextManager[SqlSession]:
        """Return a context manager yielding a session (a transaction when `is_write`)."""

    @abstractmethod
    def close(self) -> None:
        """Release connections; later calls raise StoreError."""

    def _rows(self, query: Query, params: Mapping[str, object]) -> list[tuple[Any, ...]]:
        """Run a read-only query outside a transaction."""
        with self._session(is_write=False) as session:
            return session.query(query.text(self._dialect), params)

    def _change(self, query: Query, params: Mapping[str, object]) -> int:
        """Run one write statement in its own transaction; return the rows it changed."""
        with self._session(is_write=True) as session:
            return session.execute(query.text(self._dialect), params)


def check_limit(limit: int, maximum: int) -> None:
    """Reject page sizes outside 1..maximum."""
    if not 1 <= limit <= maximum:
        raise ValueError(f"limit must be between 1 and {maximum}, got {limit}")
