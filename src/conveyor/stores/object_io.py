"""What every object store backend shares: the key rules, byte ranges and line splitting.

Byte ranges are half-open: `[start, end)`. Keys are `/`-separated relative names such as
`tenant-a/file-0123/input.jsonl`; every store accepts the same keys: no empty, `.` or `..`
segments, no segment starting with `.` (the local store keeps its temporary files under such
names), no backslashes or NUL bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

DEFAULT_CHUNK_BYTES = 1024 * 1024


def validate_key(key: str) -> str:
    """Return `key` if it is a valid object key, else raise ValueError."""
    if not key or "\\" in key or "\x00" in key:
        raise ValueError(f"invalid object key {key!r}")
    for segment in key.split("/"):
        if not segment or segment.startswith("."):
            raise ValueError(f"invalid object key {key!r}: bad segment {segment!r}")
    return key


def lines_of(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Split a chunk stream into lines without their `\\n` terminators.

    Empty lines are kept so line numbers stay aligned with the file; a final line without a
    terminator is yielded too, a terminator at the very end adds no empty line. A `\r` before
    the `\n` is kept (JSON parsers treat it as whitespace).
    """
    # Only new chunks are split; an unfinished line is kept as pieces and joined once, so a
    # very long line costs linear, not quadratic, time.
    pieces: list[bytes] = []
    for chunk in chunks:
        head, *rest = chunk.split(b"\n")
        pieces.append(head)
        if not rest:
            continue
        yield b"".join(pieces)
        yield from rest[:-1]
        pieces = [rest[-1]]
    tail = b"".join(pieces)
    if tail:
        yield tail


def check_range(start: int, end: int) -> None:
    """Reject negative or inverted ranges."""
    if not 0 <= start <= end:
        raise ValueError(f"byte range must satisfy 0 <= start <= end, got [{start}, {end})")


def check_chunk_bytes(chunk_bytes: int) -> None:
    """Reject non-positive chunk sizes."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
