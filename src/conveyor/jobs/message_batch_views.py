"""Anthropic's Message Batch objects and result lines, read from Conveyor's batch records.

A Message Batch is a batch whose endpoint is ``/v1/messages``. Its public id is the batch
id with Anthropic's prefix (``msgbatch_`` instead of ``batch_``). Statuses fold into
``processing_status``: ``in_progress`` until the batch ends (``canceling`` while it is
cancelled), then ``ended``. As in Anthropic's API, ``request_counts`` has every request
``processing`` until the batch ends, then counts each outcome: ``succeeded`` (the output
file), ``errored`` (ran and failed, or could not run), ``canceled`` and ``expired`` (never
ran). Result lines are built from the output and error files' records. Pure.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from conveyor.anthropic_errors import anthropic_error, from_openai_body
from conveyor.jobs.lines import StopCode
from conveyor.stores.records import BATCH_ID_PREFIX, BatchRecord, BatchStatus

__all__ = [
    "MESSAGE_BATCH_ID_PREFIX",
    "REQUESTS_KEY",
    "internal_id",
    "is_ended",
    "message_batch_object",
    "public_id",
    "result_line",
    "unplanned_result",
]

MESSAGE_BATCH_ID_PREFIX = "msgbatch_"
# The batch's number of requests, kept in its metadata (a failed batch has no shards to count).
REQUESTS_KEY = "message_batch_requests"
ENDED = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
_ENDED_AT = ("completed_at", "cancelled_at", "expired_at", "failed_at")
_NEVER_RAN = {StopCode.CANCELLED.value: "canceled", StopCode.EXPIRED.value: "expired"}


def public_id(batch_id: str) -> str:
    """The ``msgbatch_...`` id of a batch."""
    return MESSAGE_BATCH_ID_PREFIX + batch_id.removeprefix(BATCH_ID_PREFIX)


def internal_id(message_batch_id: str) -> str | None:
    """The batch id behind a ``msgbatch_...`` id, or None when it is not one."""
    if not message_batch_id.startswith(MESSAGE_BATCH_ID_PREFIX):
        return None
    rest = message_batch_id.removeprefix(MESSAGE_BATCH_ID_PREFIX)
    return BATCH_ID_PREFIX + rest if rest.isalnum() else None


def is_ended(status: BatchStatus) -> bool:
    """Whether every request of a batch in ``status`` has its result."""
    return status in ENDED


def processing_status(status: BatchStatus) -> str:
    """``in_progress``, ``canceling`` or ``ended``."""
    if is_ended(status):
        return "ended"
    return "canceling" if status is BatchStatus.CANCELLING else "in_progress"


def num_requests(record: BatchRecord) -> int:
    """How many requests the batch holds."""
    stored = (record.metadata or {}).get(REQUESTS_KEY, "")
    return int(stored) if stored.isdigit() else record.request_counts.total


def request_counts(record: BatchRecord) -> dict[str, int]:
    """Anthropic's ``request_counts``: all ``processing`` until the end, then by outcome."""
    total = num_requests(record)
    counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
    status = record.status
    if not is_ended(status):
        counts["processing"] = total
    elif status is BatchStatus.FAILED:
        counts["errored"] = total
    else:
        ran = record.request_counts
        counts["succeeded"], counts["errored"] = ran.completed, ran.failed
        never_ran = max(0, total - ran.completed - ran.failed)
        kind = {BatchStatus.CANCELLED: "canceled", BatchStatus.EXPIRED: "expired"}
        counts[kind.get(status, "errored")] += never_ran
    return counts


def rfc3339(unix_s: int | None) -> str | None:
    """Unix seconds as an RFC 3339 UTC time (``2025-01-31T12:00:00Z``)."""
    if unix_s is None:
        return None
    return datetime.fromtimestamp(unix_s, UTC).isoformat().replace("+00:00", "Z")


def results_path(message_batch_id: str) -> str:
    """Where a batch's results are read (relative: clients resolve it against their base)."""
    return f"/v1/messages/batches/{message_batch_id}/results"


def message_batch_object(record: BatchRecord) -> dict[str, Any]:
    """Anthropic's ``message_batch`` object."""
    batch_id = public_id(record.id)
    ended = is_ended(record.status)
    ended_at = next((getattr(record, name) for name in _ENDED_AT if getattr(record, name)), None)
    return {
        "id": batch_id,
        "type": "message_batch",
        "processing_status": processing_status(record.status),
        "request_counts": request_counts(record),
        "ended_at": rfc3339(ended_at) if ended else None,
        "created_at": rfc3339(record.created_at),
        "expires_at": rfc3339(record.expires_at),
        "archived_at": None,
        "cancel_initiated_at": rfc3339(record.cancelling_at),
        "results_url": results_path(batch_id) if ended else None,
    }


def result_line(record_line: bytes) -> bytes | None:
    """The result line of one output or error file record (None for a record that names
    no request: its input line could not be read)."""
    record = orjson.loads(record_line)
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None
    response = record.get("response")
    result: dict[str, Any]
    if isinstance(response, dict):
        status, body = int(response.get("status_code", 500)), response.get("body")
        if status == 200:
            result = {"type": "succeeded", "message": body}
        else:
            result = {"type": "errored", "error": from_openai_body(status, body)}
    else:
        error = record.get("error") or {}
        kind = _NEVER_RAN.get(str(error.get("code")))
        message = str(error.get("message") or "the request did not run")
        result = {"type": kind} if kind else {"type": "errored", "error": _api_error(message)}
    return _line(custom_id, result)


def unplanned_result(record: BatchRecord, custom_id: str) -> bytes:
    """The result line of a request in a batch that ended before it was planned: cancelled
    or expired at once, or failed (its errors say why)."""
    if record.status is BatchStatus.CANCELLED:
        return _line(custom_id, {"type": "canceled"})
    if record.status is BatchStatus.EXPIRED:
        return _line(custom_id, {"type": "expired"})
    why = "; ".join(error.message for error in record.errors or []) or "it could not start"
    error = anthropic_error(400, f"the batch failed: {why}")
    return _line(custom_id, {"type": "errored", "error": error})


def _api_error(message: str) -> dict[str, Any]:
    return anthropic_error(500, message)


def _line(custom_id: str, result: dict[str, Any]) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "result": result}) + b"\n"
