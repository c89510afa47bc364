"""The stores' own errors: what a job store or an object store raises when it fails.

Driver errors (sqlite3, psycopg, botocore, OSError) never leave a store untranslated: each
becomes one of these, chained with `raise ... from exc`. The `...UnavailableError` kinds are
also the API's 503 (see `conveyor.errors`): the storage cannot serve now, retry later.
"""

from __future__ import annotations

from conveyor.errors import JobStoreUnavailable, ObjectStoreUnavailable


class StoreError(Exception):
    """A job store operation failed in the database (connection, constraint, closed store)."""


class StoreUnavailableError(StoreError, JobStoreUnavailable):
    """The database cannot serve now (unreachable, timed out, busy, full): the API's 503."""


class ObjectStoreError(Exception):
    """An object store operation failed (I/O error, S3 error)."""


class ObjectNotFoundError(ObjectStoreError, LookupError):
    """The key names no object."""


class ObjectStoreUnavailableError(ObjectStoreError, ObjectStoreUnavailable):
    """The storage cannot serve now (disk full, I/O error, S3 unreachable): the API's 503."""
