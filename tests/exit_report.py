"""What a test says when a server it started exits before it is ready: the exit code and the
log's first error, ahead of the whole log, so that a report that keeps only the start and the
end of a long failure still shows why."""

from __future__ import annotations

import re

_ERROR = re.compile(r"Traceback \(most recent call last\)|\bERROR\b|Error:|Exception:")
ERROR_LINES = 40


def first_error(log: str, lines: int = ERROR_LINES) -> str:
    """The log from its first error line (a traceback, an ERROR record) on, ``lines`` long;
    empty where the log has none."""
    rows = log.splitlines()
    for index, row in enumerate(rows):
        if _ERROR.search(row):
            return "\n".join(rows[index : index + lines])
    return ""


def exit_report(name: str, returncode: int | None, log: str) -> str:
    """``name`` exited early with ``returncode``: its first error, then its whole log."""
    error = first_error(log) or "(no error line in its log)"
    head = f"{name} exited early (exit code {returncode}); its first error:"
    return f"{head}\n{error}\n--- its whole log ---\n{log}"
