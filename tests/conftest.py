"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.worker_groups import run_order, xdist_group_of


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group tests for ``pytest -n N --dist loadgroup`` (``make test``); harmless without it."""
    groups = []
    for item in items:
        group = xdist_group_of(item.nodeid, getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group(group))
        groups.append((item.nodeid, group))
    # The longest groups first (``tests/worker_groups.py``); xdist keeps this order.
    items[:] = [items[i] for i in run_order(groups)]


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` on a pytest whose node ids xdist 3.8 cannot mark; under
    it, start the groups in the collection's order (the longest first), not xdist's (the
    most tests first)."""
    if config.getoption("dist", default="no") != "loadgroup":
        return
    config.option.loadscopereorder = False
    if pytest.version_tuple >= (9, 2):
        raise pytest.UsageError(
            "--dist loadgroup needs pytest < 9.2 here: pytest-xdist 3.8 marks a test's group in "
            "its node id, which pytest 9.2 ignores, so every module's servers would start once "
            "per worker (see the pin in pyproject.toml)"
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker of a ``--dist loadgroup`` run, stop if the groups were lost.

    xdist carries a group as an ``@name`` suffix of each node id; without it tests sharing a
    server or a loaded model are spread over workers, each starting its own.
    """
    if not session.config.getoption("loadgroup", default=False):
        return  # not an xdist worker of a loadgroup run
    ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
    if ungrouped:
        pytest.exit(f"--dist loadgroup lost its groups, e.g. {ungrouped[0]}", returncode=4)


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
