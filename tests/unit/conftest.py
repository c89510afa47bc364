"""Unit tests fail fast: each gets a short timeout instead of the suite's 300 s.

A unit test that hangs (a regression that never resolves a future, a loop that never ends)
fails in seconds. Setup and teardown count too; the slowest unit item (a tiny model built in
a module fixture) takes about 2.5 s on an idle 2-core machine, so the limit leaves room for a
loaded one. A test may still set its own ``@pytest.mark.timeout``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT_TEST_TIMEOUT_S = 10
UNIT_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every unit test without its own timeout marker the short one."""
    for item in items:
        if item.path.is_relative_to(UNIT_DIR) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TEST_TIMEOUT_S))
