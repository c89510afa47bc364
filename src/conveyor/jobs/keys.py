"""Object store keys and derived ids of the jobs subsystem, in one place.

Shard outputs are written under their attempt, so a fenced-out attempt can never overwrite
the objects a later attempt committed. Isolation pieces (see `isolation`) are checkpoints
valid for any attempt, so their keys name only the line range.
"""

from __future__ import annotations

import hashlib

from conveyor.stores.records import FILE_ID_PREFIX

LINE_ID_PREFIX = "batch_req_"
_ID_HEX_CHARS = 24


def file_key(file_id: str) -> str:
    """Where a file's bytes live (file ids are unique across tenants)."""
    return f"files/{file_id}"


def shard_prefix(batch_id: str, index: int) -> str:
    """Common prefix of a shard's objects."""
    return f"batches/{batch_id}/shards/{index:06d}"


def _attempt_dir(attempt: int, is_speculative: bool) -> str:
    """An attempt's folder; a speculative run of the same attempt writes beside it."""
    return f"attempt-{attempt}-speculative" if is_speculative else f"attempt-{attempt}"


def shard_output_key(batch_id: str, index: int, attempt: int, is_speculative: bool = False) -> str:
    """A shard attempt's output lines."""
    return f"{shard_prefix(batch_id, index)}/{_attempt_dir(attempt, is_speculative)}/output.jsonl"


def shard_error_key(batch_id: str, index: int, attempt: int, is_speculative: bool = False) -> str:
    """A shard attempt's error lines."""
    return f"{shard_prefix(batch_id, index)}/{_attempt_dir(attempt, is_speculative)}/errors.jsonl"


def piece_key(batch_id: str, index: int, start: int, end: int, kind: str) -> str:
    """An isolation checkpoint of lines `[start, end)` of a shard (kind: started/done/out/err)."""
    return f"{shard_prefix(batch_id, index)}/pieces/{start}-{end}.{kind}"


def _digest(*parts: object) -> str:
    """A short stable hex digest of `parts`."""
    text = "\x1f".join(str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=_ID_HEX_CHARS // 2).hexdigest()


def output_file_id(batch_id: str) -> str:
    """The output file's id, derived from the batch so finalizing twice writes one file."""
    return FILE_ID_PREFIX + _digest(batch_id, "output")


def error_file_id(batch_id: str) -> str:
    """The error file's id, derived from the batch like `output_file_id`."""
    return FILE_ID_PREFIX + _digest(batch_id, "errors")


def line_id(batch_id: str, line_no: int) -> str:
    """The `id` of a line's output record: stable for the batch and input line."""
    return LINE_ID_PREFIX + _digest(batch_id, line_no)
