"""Object stores for uploaded files and shard outputs: the protocol and the factory.

Objects are written whole and atomically (a reader sees the old object, or none, until the new
one is complete) and read back as streams of chunks, whole or as a byte range, so neither side
ever holds a large file in memory. The backends are `local_store` (a local directory, the
default) and `s3_store` (S3 or an S3-compatible server); the key rules they share are in
`object_io`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, unquote, urlparse

from conveyor.stores.local_store import LocalDirObjectStore
from conveyor.stores.object_io import DEFAULT_CHUNK_BYTES

if TYPE_CHECKING:
    from conveyor.stores.s3_store import S3ObjectStore


class ObjectStore(Protocol):
    """Where file bytes live; the job store only keeps their keys."""

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write an object from chunks, atomically; return the number of bytes written."""
        ...

    def open_range(
        self, key: str, start: int, end: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> Iterator[bytes]:
        """Stream bytes `[start, end)` of an object (`end` is clamped to its size)."""
        ...

    def read_lines(self, key: str, start: int, end: int) -> Iterator[bytes]:
        """Stream the lines of bytes `[start, end)`, without their line terminators."""
        ...

    def iter_chunks(self, key: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
        """Stream a whole object."""
        ...

    def size(self, key: str) -> int:
        """Return an object's size in bytes."""
        ...

    def exists(self, key: str) -> bool:
        """Return whether an object exists under `key`."""
        ...

    def delete(self, key: str) -> bool:
        """Delete an object; return whether it existed."""
        ...


def open_object_store(url: str) -> LocalDirObjectStore | S3ObjectStore:
    """Open the object store named by `url`.

    - `file:///abs/dir` or a plain path: a local directory (created if missing);
    - `s3://bucket/prefix`, optionally with `?endpoint_url=...&region=...` for S3-compatible
      servers; credentials come from the usual AWS environment/config.
    """
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        from conveyor.stores.s3_store import S3ObjectStore

        options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        unknown = set(options) - {"endpoint_url", "region"}
        if unknown:
            raise ValueError(f"unknown s3 URL options {sorted(unknown)} in {url!r}")
        return S3ObjectStore(
            parsed.netloc,
            unquote(parsed.path),
            endpoint_url=options.get("endpoint_url"),
            region=options.get("region"),
        )
    if parsed.scheme == "file":
        return LocalDirObjectStore(unquote(parsed.path))
    if "://" in url:
        raise ValueError(f"unsupported object store URL (want file://, s3:// or a path): {url!r}")
    return LocalDirObjectStore(url)
