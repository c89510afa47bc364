"""Records go to stderr as it is when each comes: a stand-in that was closed (a test
runner's, around a command run in-process) does not swallow later records."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from conveyor.observability.logs import configure_logging


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_records_follow_stderr_after_a_stand_in_is_closed(
    root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stand_in)
    configure_logging("info")
    logging.getLogger("conveyor.t").info("while swapped")
    assert "INFO conveyor.t: while swapped" in stand_in.getvalue()
    stand_in.close()
    real = io.StringIO()
    monkeypatch.setattr(sys, "stderr", real)
    logging.getLogger("conveyor.t").info("afterwards")
    assert "INFO conveyor.t: afterwards" in real.getvalue()
    assert "Logging error" not in real.getvalue()


def test_the_json_format_writes_one_object_a_line(
    root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging("warning", "json")
    logging.getLogger("conveyor.t").info("below the level")
    logging.getLogger("conveyor.t").warning("one")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and '"one"' in lines[0]
