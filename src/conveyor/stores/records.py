"""Row types for the job store: files, batches, shards, leases and workers.

Everything here is a plain frozen dataclass or a string enum so records can cross thread and
process boundaries and be serialised without touching a database driver. Each record read
from the database is built by its `from_row`, from a row in the order its docstring names.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

FILE_ID_PREFIX = "file-"
BATCH_ID_PREFIX = "batch_"
# 12 random bytes: collisions are negligible and ids stay short enough for logs and URLs.
_ID_RANDOM_BYTES = 12


def new_file_id() -> str:
    """Return a fresh OpenAI-style file id (`file-` + random hex)."""
    return FILE_ID_PREFIX + secrets.token_hex(_ID_RANDOM_BYTES)


def new_batch_id() -> str:
    """Return a fresh OpenAI-style batch id (`batch_` + random hex)."""
    return BATCH_ID_PREFIX + secrets.token_hex(_ID_RANDOM_BYTES)


class BatchStatus(StrEnum):
    """Batch lifecycle states, spelled exactly as OpenAI's Batch API spells them."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


# The `*_at` column stamped when a batch enters each status. VALIDATING has none: a batch is
# created in it and `created_at` records that moment.
STATUS_TIMESTAMP_FIELD: dict[BatchStatus, str] = {
    BatchStatus.IN_PROGRESS: "in_progress_at",
    BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLING: "cancelling_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


class ShardStatus(StrEnum):
    """Shard states: waiting for a worker, held under a lease, or committed."""

    PENDING = "pending"
    LEASED = "leased"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class FileRecord:
    """An uploaded file. The bytes live in the object store under `object_key`."""

    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    object_key: str
    status: str = "processed"
    expires_at: int | None = None  # unix seconds; the supervisor deletes the file after it

    def __post_init__(self) -> None:
        """Reject records that could never be valid rows."""
        if not self.id.startswith(FILE_ID_PREFIX):
            raise ValueError(f"file id must start with {FILE_ID_PREFIX!r}: {self.id!r}")
        _require_text("tenant", self.tenant)
        _require_text("object_key", self.object_key)
        if self.bytes < 0:
            raise ValueError(f"bytes must be >= 0, got {self.bytes}")

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> FileRecord:
        """Build from a row holding the fields in declaration order."""
        file_id, tenant, filename, purpose, num_bytes, created_at, object_key, status = row[:8]
        expires_at = row[8]
        return cls(
            id=file_id,
            tenant=tenant,
            filename=filename,
            purpose=purpose,
            bytes=int(num_bytes),
            created_at=int(created_at),
            object_key=object_key,
            status=status,
            expires_at=None if expires_at is None else int(expires_at),
        )


@dataclass(frozen=True, slots=True)
class BatchError:
    """One entry of a batch's `errors` list (OpenAI: code, message, param, line).

    `since` (unix seconds) is Conveyor's own, kept in storage but not in OpenAI's object:
    when the stall a stall note reports began.
    """

    code: str
    message: str
    param: str | None = None
    line: int | None = None
    since: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form kept in storage (`since` only when set)."""
        stored = self.api_dict()
        if self.since is not None:
            stored["since"] = self.since
        return stored

    def api_dict(self) -> dict[str, Any]:
        """Return OpenAI's shape of the entry, as API responses list it."""
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> BatchError:
        """Build from the JSON form written by `to_dict`."""
        since = raw.get("since")
        return BatchError(
            code=str(raw["code"]),
            message=str(raw["message"]),
            param=raw.get("param"),
            line=raw.get("line"),
            since=None if since is None else int(since),
        )


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """Request totals of a batch. The store derives all three from the batch's shards."""

    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class BatchUsage:
    """Tokens a batch's committed lines used (OpenAI's Batch `usage`), summed from its shards."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


# A batch row's stored columns, in the order rows hold them (`request_counts` is derived).
BATCH_COLUMNS = (
    "id",
    "tenant",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "metadata",
    "model",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "output_file_id",
    "error_file_id",
    "errors",
    "output_expires_after_s",
    "queued_input_tokens",
)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch job. `request_counts` is read-only: the store computes it from the shards."""

    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    status: BatchStatus = BatchStatus.VALIDATING
    metadata: dict[str, str] | None = None
    model: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[BatchError] | None = None
    # Lifetime of the output and error files from their creation (`output_expires_after`).
    output_expires_after_s: int | None = None
    # Estimated input tokens, counted against the tenant's batch_queue_tokens while active.
    queued_input_tokens: int = 0
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    usage: BatchUsage = field(default_factory=BatchUsage)
    # Per shard the highest counts any attempt reported, summed: they survive a lost lease,
    # which starts the live `request_counts` of that shard over (see `jobs.views`).
    peak_counts: RequestCounts = field(default_factory=RequestCounts)

    def __post_init__(self) -> None:
        """Reject malformed ids, statuses and metadata before they reach a database."""
        if not self.id.startswith(BATCH_ID_PREFIX):
            raise ValueError(f"batch id must start with {BATCH_ID_PREFIX!r}: {self.id!r}")
        _require_text("tenant", self.tenant)
        if not isinstance(self.status, BatchStatus):
            raise ValueError(f"status must be a BatchStatus, got {self.status!r}")
        validate_metadata(self.metadata)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> BatchRecord:
        """Build from `BATCH_COLUMNS` (JSON text for metadata and errors) then the shard sums
        of lines, completed and failed requests, input and output tokens, peak completed and
        peak failed requests."""
        num_stored = len(BATCH_COLUMNS)
        values: dict[str, Any] = dict(zip(BATCH_COLUMNS, row[:num_stored], strict=True))
        total, completed, failed, input_tokens, output_tokens, peak_done, peak_failed = row[
            num_stored:
        ]
        values["status"] = BatchStatus(values["status"])
        values["metadata"] = None if values["metadata"] is None else json.loads(values["metadata"])
        raw_errors = values["errors"]
        if raw_errors is not None:
            values["errors"] = [BatchError.from_dict(e) for e in json.loads(raw_errors)]
        counts = RequestCounts(total=int(total), completed=int(completed), failed=int(failed))
        usage = BatchUsage(int(input_tokens), int(output_tokens))
        peak = RequestCounts(total=int(total), completed=int(peak_done), failed=int(peak_failed))
        return cls(**values, request_counts=counts, usage=usage, peak_counts=peak)


def validate_metadata(metadata: dict[str, str] | None) -> None:
    """Raise ValueError unless `metadata` is None or a str -> str mapping."""
    if metadata is None:
        return
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"metadata must map str to str, got {key!r}: {value!r}")


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """What the planner decides for a shard: a line-aligned byte range of the input file.

    `byte_end` is exclusive. `first_line` is the 0-based line number of the range's first line
    in the whole input file, so workers can report errors with file-wide line numbers.
    """

    index: int
    byte_start: int
    byte_end: int
    first_line: int
    num_lines: int

    def __post_init__(self) -> None:
        """Reject negative positions and inverted ranges."""
        if self.index < 0 or self.first_line < 0 or self.num_lines < 0:
            raise ValueError(f"shard index, first_line and num_lines must be >= 0: {self}")
        if not 0 <= self.byte_start <= self.byte_end:
            raise ValueError(f"shard byte range must satisfy 0 <= start <= end: {self}")


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """A shard row as stored, including lease and progress state."""

    batch_id: str
    index: int
    byte_start: int
    byte_end: int
    first_line: int
    num_lines: int
    status: ShardStatus
    attempt: int
    lease_owner: str | None
    lease_expires_at: float | None
    output_key: str | None
    error_key: str | None
    num_completed: int
    num_failed: int
    started_at: float | None
    committed_at: float | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ShardRecord:
        """Build from a row holding the fields in declaration order."""
        (batch_id, index, byte_start, byte_end, first_line, num_lines, status, attempt) = row[:8]
        (owner, expires_at, output_key, error_key, completed, failed, started, committed) = row[8:]
        return cls(
            batch_id=batch_id,
            index=int(index),
            byte_start=int(byte_start),
            byte_end=int(byte_end),
            first_line=int(first_line),
            num_lines=int(num_lines),
            status=ShardStatus(status),
            attempt=int(attempt),
            lease_owner=owner,
            lease_expires_at=_float_or_none(expires_at),
            output_key=output_key,
            error_key=error_key,
            num_completed=int(completed),
            num_failed=int(failed),
            started_at=_float_or_none(started),
            committed_at=_float_or_none(committed),
        )


@dataclass(frozen=True, slots=True)
class ShardLease:
    """Proof that `worker_id` holds attempt `attempt` of a shard until `lease_expires_at`.

    `attempt` is the fencing token: every fenced call compares it with the stored attempt, so a
    worker whose lease was taken over can no longer change the shard.

    A speculative lease (`is_speculative`) runs the same attempt a second time, beside a
    straggling original: it is fenced by its own owner slot, and whichever of the two commits
    first wins.
    """

    batch_id: str
    index: int
    attempt: int
    worker_id: str
    lease_expires_at: float
    byte_start: int
    byte_end: int
    first_line: int
    num_lines: int
    is_speculative: bool = False

    @classmethod
    def from_row(cls, row: Sequence[Any], *, is_speculative: bool = False) -> ShardLease:
        """Build from a row holding the fields in declaration order, up to `num_lines`."""
        batch_id, index, attempt, owner, expires_at, byte_start, byte_end, first_line, lines = row
        return cls(
            batch_id=batch_id,
            index=int(index),
            attempt=int(attempt),
            worker_id=owner,
            lease_expires_at=float(expires_at),
            byte_start=int(byte_start),
            byte_end=int(byte_end),
            first_line=int(first_line),
            num_lines=int(lines),
            is_speculative=is_speculative,
        )

    @classmethod
    def of_shard(cls, shard: ShardRecord) -> ShardLease:
        """A lease naming the shard's current attempt and holder (for a fenced release)."""
        return cls(
            batch_id=shard.batch_id,
            index=shard.index,
            attempt=shard.attempt,
            worker_id=shard.lease_owner or "",
            lease_expires_at=shard.lease_expires_at or 0.0,
            byte_start=shard.byte_start,
            byte_end=shard.byte_end,
            first_line=shard.first_line,
            num_lines=shard.num_lines,
        )


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A registered worker and how long ago it last sent a heartbeat."""

    worker_id: str
    address: str
    models: tuple[str, ...]
    capacity: int
    load: dict[str, Any]
    last_heartbeat_at: float
    heartbeat_age_s: float
    is_stale: bool

    @classmethod
    def from_row(cls, row: Sequence[Any], now: float, stale_after_s: float) -> WorkerRecord:
        """Build from (worker_id, address, models JSON, capacity, load JSON, heartbeat_at),
        aged as of `now`: stale when the heartbeat is more than `stale_after_s` old."""
        worker_id, address, models, capacity, load, heartbeat_at = row
        age_s = float(now) - float(heartbeat_at)
        return cls(
            worker_id=worker_id,
            address=address,
            models=tuple(json.loads(models)),
            capacity=int(capacity),
            load=json.loads(load),
            last_heartbeat_at=float(heartbeat_at),
            heartbeat_age_s=age_s,
            is_stale=age_s > stale_after_s,
        )


def _require_text(name: str, value: str) -> None:
    """Raise ValueError when a required text field is empty."""
    if not value:
        raise ValueError(f"{name} must be a non-empty string")


def _float_or_none(value: Any) -> float | None:
    """A nullable float column."""
    return None if value is None else float(value)
