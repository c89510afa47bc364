"""Where a shard attempt collects its output and error records until it commits.

Records go to spooled temporary files: small shards stay in memory, big ones spill to disk,
so a runner's memory stays bounded whatever the size of the responses.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from typing import IO

SPOOL_BYTES = 4 * 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024


class RecordSpool:
    """An append-only sequence of JSONL records, read back as chunks."""

    def __init__(self) -> None:
        """Start empty (nothing touches the disk until `SPOOL_BYTES` are written)."""
        # Closed by `close`, not a with-block: the spool lives as long as its shard attempt.
        self._file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
        self.num_records = 0
        self.num_bytes = 0

    def add(self, record: bytes) -> None:
        """Append one record (a JSONL line with its newline)."""
        self._file.write(record)
        self.num_records += 1
        self.num_bytes += len(record)

    def add_chunks(self, chunks: Iterable[bytes], num_records: int) -> None:
        """Append already-formatted records (a copied object) holding `num_records` records."""
        for chunk in chunks:
            self._file.write(chunk)
            self.num_bytes += len(chunk)
        self.num_records += num_records

    def chunks(self) -> Iterator[bytes]:
        """Everything written so far, from the start."""
        self._file.flush()
        self._file.seek(0)
        while chunk := self._file.read(READ_CHUNK_BYTES):
            yield chunk
        self._file.seek(0, 2)  # back to the end, so later writes append

    def close(self) -> None:
        """Release the memory or temporary file."""
        self._file.close()


class ShardSink:
    """A shard attempt's outputs and errors, and its request counts.

    `num_failed` counts requests that ran and failed (or were isolated); requests that never
    ran because the batch was cancelled or expired are recorded but not counted, as OpenAI's
    `request_counts` do not count them.
    """

    def __init__(self) -> None:
        """Start with no records."""
        self.outputs = RecordSpool()
        self.errors = RecordSpool()
        self.num_completed = 0
        self.num_failed = 0

    def add_output(self, record: bytes) -> None:
        """A successful response."""
        self.outputs.add(record)
        self.num_completed += 1

    def add_failure(self, record: bytes) -> None:
        """A request that ran and failed (or was isolated)."""
        self.errors.add(record)
        self.num_failed += 1

    def add_not_run(self, record: bytes) -> None:
        """A request that never ran (cancelled or expired): recorded, not counted."""
        self.errors.add(record)

    @property
    def num_recorded(self) -> int:
        """Requests with a record, whatever their kind."""
        return self.outputs.num_records + self.errors.num_records

    def close(self) -> None:
        """Release both spools."""
        self.outputs.close()
        self.errors.close()
