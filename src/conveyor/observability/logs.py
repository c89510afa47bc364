"""Log set-up for every process: ``text`` (default) or ``json``, one object per line.

Structured fields travel in ``extra={"fields": {...}}`` (see ``log_event``): the JSON format
puts them at the top level of the line, the text format appends them as ``key=value``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Literal

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


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """Send the root logger to stderr in ``log_format`` at ``level`` (replacing handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def log_event(logger: logging.Logger, level: int, event: str, message: str, **fields: Any) -> None:
    """Log a lifecycle event (``worker_joined``, ``lease_lost``...) with its ids as fields."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={"fields": {"event": event, **fields}})
