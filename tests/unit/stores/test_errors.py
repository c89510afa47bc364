"""Driver errors that mean "the store cannot serve now" become 503s naming the store; the rest
stay plain store errors. Also the PostgreSQL connection parameters that bound every wait."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from conveyor.errors import ConveyorError, JobStoreUnavailable, ObjectStoreUnavailable
from conveyor.stores import local_store
from conveyor.stores.errors import (
    ObjectStoreError,
    ObjectStoreUnavailableError,
    StoreError,
    StoreUnavailableError,
)
from conveyor.stores.local_store import LocalDirObjectStore
from conveyor.stores.postgres_store import connect_params
from conveyor.stores.postgres_store import is_unavailable as pg_unavailable
from conveyor.stores.records import FileRecord
from conveyor.stores.s3_store import S3ObjectStore
from conveyor.stores.sqlite_store import SqliteJobStore
from conveyor.stores.sqlite_store import is_unavailable as sqlite_unavailable
from conveyor.stores.timeouts import PostgresTimeouts
from tests.disk_full import FullDisk


def a_file(file_id: str = "file-1") -> FileRecord:
    return FileRecord(id=file_id, tenant="t", filename="f.jsonl", purpose="batch", bytes=1,
                      created_at=1, object_key=f"t/{file_id}")  # fmt: skip


# -- the HTTP side of the errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (StoreUnavailableError("postgres unavailable: x"), "job_store_unavailable"),
        (ObjectStoreUnavailableError("i/o error: y"), "object_store_unavailable"),
    ],
)
def test_unavailable_stores_answer_503_with_retry_after_naming_the_store(
    error: ConveyorError, code: str
) -> None:
    assert error.status_code == 503
    assert int(error.headers()["Retry-After"]) > 0
    assert error.to_body() == {
        "error": {"message": str(error), "type": "server_error", "param": None, "code": code}
    }


def test_unavailable_errors_are_still_the_stores_own_errors() -> None:
    # The background loops catch StoreError / ObjectStoreError; the API maps ConveyorError.
    assert isinstance(StoreUnavailableError("x"), StoreError | JobStoreUnavailable)
    assert isinstance(ObjectStoreUnavailableError("x"), ObjectStoreError | ObjectStoreUnavailable)
    assert not isinstance(StoreError("x"), ConveyorError)


# -- PostgreSQL --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection refused"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.DiskFull("could not extend file"),
        psycopg.errors.AdminShutdown("terminating connection"),
        psycopg.errors.TooManyConnections("too many clients"),
        psycopg.errors.ConnectionTimeout("connection timeout expired"),
    ],
)
def test_postgres_outages_are_unavailable(exc: psycopg.Error) -> None:
    assert pg_unavailable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.errors.UniqueViolation("duplicate key"),
        psycopg.errors.UndefinedTable("no such table"),
        psycopg.errors.ProgramLimitExceeded("statement too complex"),
        psycopg.InterfaceError("misuse"),
    ],
)
def test_postgres_bugs_and_bad_data_are_not(exc: psycopg.Error) -> None:
    assert not pg_unavailable(exc)


def test_connect_params_bound_every_wait() -> None:
    timeouts = PostgresTimeouts(connect_timeout_s=4, statement_timeout_ms=2500)
    params = connect_params("postgresql://u@db.example:5433/jobs", timeouts)
    assert params["host"] == "db.example" and params["port"] == "5433"
    assert params["connect_timeout"] == 4
    assert params["keepalives"] == 1 and params["keepalives_idle"] > 0
    assert params["tcp_user_timeout"] == 3500  # statement timeout + the client's grace
    assert params["options"] == "-c statement_timeout=2500"
    assert timeouts.round_trip_timeout_s == 3.5


def test_settings_in_the_url_win() -> None:
    url = "postgresql://u@h/db?connect_timeout=9&options=-c%20statement_timeout%3D0"
    params = connect_params(url, PostgresTimeouts())
    assert params["connect_timeout"] == "9"
    # Postgres applies `-c` settings in order: the URL's, last, wins.
    assert params["options"] == "-c statement_timeout=3000 -c statement_timeout=0"


@pytest.mark.parametrize(
    "fields",
    [{"connect_timeout_s": 1}, {"statement_timeout_ms": 0}, {"acquire_timeout_s": 0}],
)
def test_timeouts_that_mean_forever_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PostgresTimeouts(**fields)


# -- SQLite ------------------------------------------------------------------------------------


def test_a_locked_sqlite_file_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path, busy_timeout_ms=0)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailableError, match="locked") as caught:
            store.create_file(a_file())
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.create_file(a_file())  # usable again once the lock is gone
    store.close()


def test_a_wrong_statement_is_a_plain_store_error() -> None:
    store = SqliteJobStore(":memory:")
    with pytest.raises(StoreError) as caught, store._session(is_write=False) as session:
        session.query("SELECT * FROM no_such_table", {})
    assert not isinstance(caught.value, StoreUnavailableError)
    store.close()


@pytest.mark.parametrize(
    ("code", "is_down"),
    [
        (sqlite3.SQLITE_FULL, True),
        (sqlite3.SQLITE_IOERR, True),
        (sqlite3.SQLITE_IOERR | (3 << 8), True),  # SQLITE_IOERR_WRITE: an extended code
        (sqlite3.SQLITE_BUSY, True),
        (sqlite3.SQLITE_CANTOPEN, True),
        (sqlite3.SQLITE_CONSTRAINT, False),
        (sqlite3.SQLITE_ERROR, False),
    ],
)
def test_sqlite_result_codes(code: int, is_down: bool) -> None:
    exc = sqlite3.OperationalError("x")
    exc.sqlite_errorcode = code
    assert sqlite_unavailable(exc) is is_down


# -- local directory ---------------------------------------------------------------------------


@pytest.mark.parametrize("errno_code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_a_full_disk_is_unavailable_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_code: int
) -> None:
    store = LocalDirObjectStore(tmp_path)
    store.put_stream("t/old", [b"previous version\n"])
    monkeypatch.setattr(local_store, "os", FullDisk(capacity_bytes=1000, errno_code=errno_code))
    with pytest.raises(ObjectStoreUnavailableError) as caught:
        store.put_stream("t/old", [b"x" * 600, b"y" * 600])
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno_code
    assert caught.value.code == "object_store_unavailable"
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["old"]  # no temp file left
    assert b"".join(store.iter_chunks("t/old")) == b"previous version\n"


def test_reading_from_a_failing_disk_is_unavailable(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "dir").mkdir()  # reading a directory as a file is an OSError
    with pytest.raises(ObjectStoreUnavailableError):
        list(store.iter_chunks("t/dir"))


# -- S3 ----------------------------------------------------------------------------------------


class FailingS3:
    """An S3 client whose every call raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def call(**_: Any) -> Any:
            raise self.error

        return call


def client_error(code: str, status: int) -> ClientError:
    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "PutObject")


@pytest.mark.parametrize(
    "error",
    [
        EndpointConnectionError(endpoint_url="http://s3.invalid"),
        ReadTimeoutError(endpoint_url="http://s3.invalid"),
        client_error("SlowDown", 503),
        client_error("InternalError", 500),
    ],
)
def test_s3_outages_are_unavailable(error: Exception) -> None:
    store = S3ObjectStore("bucket", client=FailingS3(error))
    with pytest.raises(ObjectStoreUnavailableError):
        store.put_stream("t/key", [b"data"])


def test_s3_refusals_are_plain_errors() -> None:
    store = S3ObjectStore("bucket", client=FailingS3(client_error("AccessDenied", 403)))
    with pytest.raises(ObjectStoreError) as caught:
        store.put_stream("t/key", [b"data"])
    assert not isinstance(caught.value, ObjectStoreUnavailableError)
