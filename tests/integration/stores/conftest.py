"""Fixtures for the store tests: one job store per implementation, each empty.

`job_store` runs a test on the in-memory fake, SQLite and PostgreSQL alike; `job_store_url`
only on the SQL backends. PostgreSQL tests get a fresh database from the root conftest's
`postgres_url` (see tests/postgres.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.fakes import MemoryJobStore
from conveyor.stores import JobStore, open_job_store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def job_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty job store database for each backend."""
    if request.param == "sqlite":
        # A nested directory checks that the factory creates parent directories.
        return f"sqlite://{tmp_path}/nested/jobs.sqlite"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def job_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobStore]:
    """An open, empty job store of each implementation, closed after the test."""
    if request.param == "memory":
        store: JobStore = MemoryJobStore()
    elif request.param == "sqlite":
        store = open_job_store(f"sqlite://{tmp_path}/nested/jobs.sqlite")
    else:
        store = open_job_store(request.getfixturevalue("postgres_url"))
    try:
        yield store
    finally:
        store.close()
