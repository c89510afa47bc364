"""Fixtures for the store tests: one job store per backend, each in a fresh database.

PostgreSQL tests get a fresh database from the root conftest's `postgres_url` (see
tests/postgres.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.stores import JobStore, open_job_store


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
