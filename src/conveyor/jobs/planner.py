"""The planner: one streaming pass over an input file validates it and cuts it into shards.

A shard is a line-aligned byte range of the input holding about `lines_per_shard` requests;
the job store keeps only these references, never the lines. Ranges are contiguous, so blank
lines between requests belong to some shard (workers skip them) and line numbers stay exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from conveyor.jobs.validation import InputValidator, ValidationReport
from conveyor.stores.object_store import ObjectStore
from conveyor.stores.records import ShardSpec


class ShardPlanner:
    """Accumulates lines (their sizes) and closes a shard after every N requests."""

    def __init__(self, lines_per_shard: int) -> None:
        """Plan shards of `lines_per_shard` requests (the last one may hold fewer)."""
        if lines_per_shard < 1:
            raise ValueError(f"lines_per_shard must be >= 1, got {lines_per_shard}")
        self.lines_per_shard = lines_per_shard
        self._shards: list[ShardSpec] = []
        self._offset = 0
        self._line_no = 0
        self._start = 0
        self._first_line = 0
        self._num_lines = 0

    def add_line(self, num_bytes: int, is_request: bool) -> None:
        """Account for the next line: `num_bytes` including its `\\n` terminator."""
        self._offset += num_bytes
        self._line_no += 1
        if is_request:
            self._num_lines += 1
            if self._num_lines == self.lines_per_shard:
                self._close()

    def _close(self) -> None:
        """End the current shard at the current offset."""
        spec = ShardSpec(
            index=len(self._shards),
            byte_start=self._start,
            byte_end=self._offset,
            first_line=self._first_line,
            num_lines=self._num_lines,
        )
        self._shards.append(spec)
        self._start = self._offset
        self._first_line = self._line_no
        self._num_lines = 0

    def finish(self, total_bytes: int) -> list[ShardSpec]:
        """Close the last shard and return all of them.

        `total_bytes` is the file size: a last line without a terminator was counted one
        byte too long, so the final range is clamped to the file.
        """
        if self._num_lines:
            self._offset = min(self._offset, total_bytes)
            self._close()
        return list(self._shards)


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The outcome of the planning pass: the validation report and, if valid, the shards."""

    report: ValidationReport
    shards: list[ShardSpec]


def scan_lines(
    lines: Iterable[bytes], validator: InputValidator, planner: ShardPlanner, total_bytes: int
) -> BatchPlan:
    """Validate every line and plan shards in one pass."""
    for line_no, raw in enumerate(lines):
        is_request = validator.check_line(line_no, raw)
        planner.add_line(len(raw) + 1, is_request)
    report = validator.finish()
    shards = planner.finish(total_bytes) if report.is_valid else []
    return BatchPlan(report, shards)


def plan_batch(
    objects: ObjectStore,
    key: str,
    *,
    endpoint: str,
    is_model_served: Callable[[str], bool],
    lines_per_shard: int,
    max_requests: int,
    max_listed_errors: int,
) -> BatchPlan:
    """Read the input object once (streamed) and plan its batch; blocking, run in a thread."""
    total_bytes = objects.size(key)
    validator = InputValidator(endpoint, is_model_served, max_requests, max_listed_errors)
    return scan_lines(
        objects.read_lines(key, 0, total_bytes),
        validator,
        ShardPlanner(lines_per_shard),
        total_bytes,
    )


def shard_requests(lines: Iterable[bytes], first_line: int) -> Iterator[tuple[int, bytes]]:
    """The request lines of a shard's byte range with their 0-based file line numbers."""
    for offset, raw in enumerate(lines):
        if raw.strip():
            yield first_line + offset, raw
