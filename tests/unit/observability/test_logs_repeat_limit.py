"""A warning anyone can trigger per connection is logged once a minute, with a count."""

from __future__ import annotations

import logging

from conveyor.observability.logs import RepeatLimit


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message, (), None)


def test_a_flood_of_bad_requests_logs_one_line_a_minute_with_the_count() -> None:
    now = [0.0]
    limit = RepeatLimit(every_s=60.0, clock=lambda: now[0])
    passed = [limit.filter(record("Invalid HTTP request received.")) for _ in range(1000)]
    assert passed.count(True) == 1
    now[0] = 61.0
    later = record("Invalid HTTP request received.")
    assert limit.filter(later)
    assert later.getMessage() == "Invalid HTTP request received. (999 more held back)"


def test_other_records_always_pass() -> None:
    limit = RepeatLimit(every_s=60.0, clock=lambda: 0.0)
    assert all(limit.filter(record("the worker w1 joined")) for _ in range(5))
