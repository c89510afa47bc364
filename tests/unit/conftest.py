"""Unit tests fail fast: each gets a short timeout instead of the suite's 300 s.

A unit test that hangs (a regression that never resolves a future, a loop that never ends)
fails in half a minute, not five. Setup and teardown count too. The slowest unit item (a tiny
model built in a module fixture) takes about 3 s on an idle 2-core machine, and most take well
under 1 s; but in ``make test`` the unit tests share the two cores with integration tests that
run vLLM's CPU build, inductor's compile workers and coverage's tracer, and there a 0.5 s
simulation and a 0.3 s GGUF read each once ran past a 10 s limit. A test may still set its own
``@pytest.mark.timeout``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT_TEST_TIMEOUT_S = 30
UNIT_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every unit test without its own timeout marker the short one."""
    for item in items:
        if item.path.is_relative_to(UNIT_DIR) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TEST_TIMEOUT_S))
