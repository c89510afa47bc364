"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# The database drivers are imported by the fixtures that need them, so the engine's tests
# also run where only torch and the engine's own dependencies are installed (a GPU image).


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The PostgreSQL admin URL, after checking that the server answers."""
    from tests.postgres import require_postgres

    return require_postgres()


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """URL of a brand-new PostgreSQL database, dropped after the test."""
    from tests.postgres import fresh_database

    with fresh_database(postgres_admin_url) as url:
        yield url


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own in the local Redis, deleted after the test."""
    from tests.redis_server import unique_prefix

    with unique_prefix() as prefix:
        yield prefix
