"""Fixtures for the store tests: one job store per backend, each in a fresh database.

PostgreSQL tests create a uniquely named database through the admin URL (default: the local
server's `test` database, overridable with CONVEYOR_TEST_PG_URL) and drop it afterwards. When
the server is unreachable they are skipped, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from conveyor.stores.job_store import JobStore, open_job_store

PG_ADMIN_URL = os.environ.get("CONVEYOR_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_CONNECT_TIMEOUT_S = 3


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The admin URL, after checking that the server answers (skip or fail otherwise)."""
    try:
        psycopg.connect(PG_ADMIN_URL, connect_timeout=PG_CONNECT_TIMEOUT_S).close()
    except psycopg.Error as exc:
        reason = f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return PG_ADMIN_URL


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """URL of a brand-new database, dropped (with its connections) after the test."""
    name = f"conveyor_test_{uuid.uuid4().hex}"
    with psycopg.connect(postgres_admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(postgres_admin_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(postgres_admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def job_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty job store database for each backend."""
    if request.param == "sqlite":
        # A nested directory checks that the factory creates parent directories.
        return f"sqlite://{tmp_path}/nested/jobs.sqlite"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def job_store(job_store_url: str) -> Iterator[JobStore]:
    """An open, migrated job store, closed after the test."""
    store = open_job_store(job_store_url)
    try:
        yield store
    finally:
        store.close()
