"""Log set-up for every process: ``text`` (default) or ``json``, one object per line.

Structured fields travel in ``extra={"fields": {...}}`` (see ``log_event``): the JSON format
puts them at the top level of the line, the text format appends them as ``key=value``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import orjson

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, Mapping) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then its fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """The classic text line, with any structured fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The record as text."""
        text = super().format(record)
        fields = _fields(record)
        if not fields:
            return text
        pairs = " ".join(f"{key}={value}" for key, value in fields.items() if value is not None)
        return f"{text} [{pairs}]"


# uvicorn's warnings about one connection's bad bytes: anyone can send them, as fast as
# they like, so each is logged at most once per PER_CONNECTION_WARNING_EVERY_S.
PER_CONNECTION_WARNINGS = frozenset(
    {"Invalid HTTP request received.", "Unsupported upgrade request."}
)
PER_CONNECTION_WARNING_EVERY_S = 60.0


class RepeatLimit(logging.Filter):
    """Lets a per-connection warning through once per interval, with how many were held
    back since; every other record passes."""

    def __init__(
        self, every_s: float = PER_CONNECTION_WARNING_EVERY_S, clock: Any = time.monotonic
    ) -> None:
        super().__init__()
        self._every_s = every_s
        self._clock = clock
        self._next_s: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a repeat inside the interval; the first after it names the count."""
        message = record.getMessage()
        if message not in PER_CONNECTION_WARNINGS:
            return True
        now_s = self._clock()
        if now_s < self._next_s.get(message, 0.0):
            self._held[message] = self._held.get(message, 0) + 1
            return False
        self._next_s[message] = now_s + self._every_s
        held = self._held.pop(message, 0)
        if held:
            record.msg, record.args = f"{message} ({held} more held back)", ()
        return True


class StderrHandler(logging.StreamHandler[TextIO]):
    """A ``StreamHandler`` on ``sys.stderr`` as it is when each record comes, not as it was
    when the handler was made: a caller that swaps stderr for a while (a command run
    in-process by a test runner, which closes its stand-in afterwards) leaves later records
    going to the real one instead of failing on a closed stream."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)  # not StreamHandler's: it would bind a stream

    @property
    def stream(self) -> TextIO:  # type: ignore[override]  # read-only, always the current one
        """The current ``sys.stderr``."""
        return sys.stderr


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """Send the root logger to stderr in ``log_format`` at ``level`` (replacing handlers)."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    # On the logger, not a handler: uvicorn logs through handlers of its own.
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, RepeatLimit) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(RepeatLimit())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def log_event(logger: logging.Logger, level: int, event: str, message: str, **fields: Any) -> None:
    """Log a lifecycle event (``worker_joined``, ``lease_lost``...) with its ids as fields."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"fields": {"event": event, **fields}})
