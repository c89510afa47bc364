"""The JSON shapes of OpenAI's File and Batch objects and their list pages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from conveyor.stores.records import BatchRecord, BatchStatus, FileRecord, RequestCounts

# Every `*_at` field of the record, in its declared order (OpenAI's object has each one).
BATCH_TIMESTAMPS = tuple(f.name for f in fields(BatchRecord) if f.name.endswith("_at"))
# A Batch object lists at most this many errors; `total_errors` says how many there are.
MAX_LISTED_ERRORS = 100
# Ends in which lines that never ran are reported in the error file, so count as failed.
UNFINISHED_ENDS = (BatchStatus.CANCELLED, BatchStatus.EXPIRED)
FINISHED = (BatchStatus.COMPLETED, BatchStatus.FAILED, *UNFINISHED_ENDS)


def file_object(rec: FileRecord) -> dict[str, Any]:
    """OpenAI's File object."""
    return {
        "id": rec.id,
        "object": "file",
        "bytes": rec.bytes,
        "created_at": rec.created_at,
        "filename": rec.filename,
        "purpose": rec.purpose,
        "status": rec.status,
        "expires_at": rec.expires_at,
        "status_details": None,
    }


def deleted_file_object(file_id: str) -> dict[str, Any]:
    """OpenAI's answer to a file deletion."""
    return {"id": file_id, "object": "file", "deleted": True}


def batch_object(rec: BatchRecord) -> dict[str, Any]:
    """OpenAI's Batch object; `errors` is a list object or null."""
    errors = None
    if rec.errors:
        listed = [e.api_dict() for e in rec.errors[:MAX_LISTED_ERRORS]]
        errors = {"object": "list", "data": listed, "total_errors": len(rec.errors)}
    body: dict[str, Any] = {
        "id": rec.id,
        "object": "batch",
        "endpoint": rec.endpoint,
        "model": rec.model,
        "errors": errors,
        "input_file_id": rec.input_file_id,
        "completion_window": rec.completion_window,
        "status": rec.status.value,
        "output_file_id": rec.output_file_id,
        "error_file_id": rec.error_file_id,
    }
    body.update({name: getattr(rec, name) for name in BATCH_TIMESTAMPS})
    counts = reported_counts(rec)
    body["request_counts"] = {
        "total": counts.total,
        "completed": counts.completed,
        "failed": counts.failed,
    }
    body["metadata"] = rec.metadata
    usage = rec.usage
    body["usage"] = {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }
    return body


def reported_counts(rec: BatchRecord) -> RequestCounts:
    """The counts a client sees.

    While the batch runs, each count is the most it has shown: a shard whose lease was lost
    starts over from zero, but its lines were done once and will be again, so the figure
    holds (`peak_counts`) instead of falling back. Were a rerun to split its lines otherwise
    (a line failing now that had completed), failed is cut so that completed + failed never
    passes total. A finished batch shows what its files hold: in a cancelled or expired
    batch lines that never ran are failed (each has a record in the error file), so
    completed + failed = total.
    """
    counts, status = rec.request_counts, rec.status
    if status in UNFINISHED_ENDS:
        return RequestCounts(counts.total, counts.completed, counts.total - counts.completed)
    if status in FINISHED:
        return counts
    completed = max(counts.completed, rec.peak_counts.completed)
    failed = min(max(counts.failed, rec.peak_counts.failed), counts.total - completed)
    return RequestCounts(counts.total, completed, failed)


def list_page(data: Sequence[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's cursor page: `first_id`, `last_id` and `has_more` around the items."""
    return {
        "object": "list",
        "data": list(data),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
