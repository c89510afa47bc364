"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres import fresh_database, require_postgres
from tests.redis_server import unique_prefix


@pytest.fixture()
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """The PostgreSQL admin URL, after checking that the server answers."""
    return require_postgres()


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """URL of a brand-new PostgreSQL database, dropped after the test."""
    with fresh_database(postgres_admin_url) as url:
        yield url


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own in the local Redis, deleted after the test."""
    with unique_prefix() as prefix:
        yield prefix
