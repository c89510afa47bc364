"""The PostgreSQL server the tests use, and fresh databases on it.

The admin URL defaults to the local server's `test` database (override with
CONVEYOR_TEST_PG_URL). An unreachable server skips a test, except under CI=true,
where it is a failure: CI has the server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tests.missing import missing

PG_ADMIN_URL = os.environ.get("CONVEYOR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_CONNECT_TIMEOUT_S = 3


def require_postgres() -> str:
    """The admin URL once the server answers; skip (or, on CI, fail) otherwise."""
    try:
        psycopg.connect(PG_ADMIN_URL, connect_timeout=PG_CONNECT_TIMEOUT_S).close()
    except psycopg.Error as exc:
        missing(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    return PG_ADMIN_URL


@contextmanager
def fresh_database(admin_url: str, prefix: str = "conveyor_test") -> Iterator[str]:
    """URL of a brand-new uniquely named database, dropped (with its connections) after."""
    name = f"{prefix}_{uuid.uuid4().hex}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
