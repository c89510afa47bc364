"""Object stores for uploaded files and shard outputs: a local directory or an S3 bucket.

Objects are written whole and atomically (a reader sees the old object, or none, until the new
one is complete) and read back as streams of chunks, whole or as a byte range, so neither side
ever holds a large file in memory. Byte ranges are half-open: `[start, end)`.

Keys are `/`-separated relative names such as `tenant-a/file-0123/input.jsonl`. Both stores
accept the same keys: no empty, `.` or `..` segments, no segment starting with `.` (the local
store keeps its temporary files under such names), no backslashes or NUL bytes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol
from urllib.parse import parse_qs, unquote, urlparse

from conveyor.errors import ObjectStoreUnavailable

if TYPE_CHECKING:
    from conveyor.stores.s3_store import S3ObjectStore

DEFAULT_CHUNK_BYTES = 1024 * 1024


class ObjectStoreError(Exception):
    """An object store operation failed (I/O error, S3 error)."""


class ObjectNotFoundError(ObjectStoreError, LookupError):
    """The key names no object."""


class ObjectStoreUnavailableError(ObjectStoreError, ObjectStoreUnavailable):
    """The storage cannot serve now (disk full, I/O error, S3 unreachable): the API's 503."""


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


class LocalDirObjectStore:
    """Objects as files under a root directory; writes go to a temp file, then `os.replace`."""

    def __init__(self, root: str | Path) -> None:
        """Use (and create) `root` as the store's directory."""
        self._root = Path(root)
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ObjectStoreError(f"cannot create object store root {self._root}") from exc

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    def _path(self, key: str) -> Path:
        """Filesystem path of a (validated) key."""
        return self._root.joinpath(*validate_key(key).split("/"))

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> int:
        """Write an object from chunks, atomically; return the number of bytes written.

        Bytes go to a hidden temp file in the target directory (same filesystem, so the final
        rename is atomic), are fsynced, then renamed over the key. On any failure the temp file
        is removed and the key is left as it was.
        """
        path = self._path(key)
        with _os_errors(key):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            try:
                num_bytes = _write_all(fd, chunks)
                os.replace(tmp_name, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_name)
                raise
            _fsync_dir(path.parent)
        return num_bytes

    def open_range(
        self, key: str, start: int, end: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> Iterator[bytes]:
        """Stream bytes `[start, end)` of an object (`end` is clamped to its size).

        A missing key raises ObjectNotFoundError here, not on the first read.
        """
        check_range(start, end)
        check_chunk_bytes(chunk_bytes)
        path = self._path(key)
        with _os_errors(key):
            handle = path.open("rb")
        return _read_range(key, handle, start, end, chunk_bytes)

    def read_lines(self, key: str, start: int, end: int) -> Iterator[bytes]:
        """Stream the lines of bytes `[start, end)`, without their line terminators."""
        return lines_of(self.open_range(key, start, end))

    def iter_chunks(self, key: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
        """Stream a whole object."""
        return self.open_range(key, 0, self.size(key), chunk_bytes)

    def size(self, key: str) -> int:
        """Return an object's size in bytes."""
        with _os_errors(key):
            return self._path(key).stat().st_size

    def exists(self, key: str) -> bool:
        """Return whether an object exists under `key`."""
        return self._path(key).is_file()

    def delete(self, key: str) -> bool:
        """Delete an object; return whether it existed."""
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ObjectStoreUnavailableError(f"cannot delete {key!r}: {exc}") from exc
        return True


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


# -- helpers (private) -------------------------------------------------------------------------


@contextlib.contextmanager
def _os_errors(key: str) -> Iterator[None]:
    """Translate OSError into the object store's errors.

    Any other OSError (no space, quota, I/O error, read-only or unmounted disk) is the
    storage failing, not the caller: unavailable, so the API answers 503 and jobs retry.
    """
    try:
        yield
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(key) from exc
    except OSError as exc:
        raise ObjectStoreUnavailableError(f"i/o error on {key!r}: {exc}") from exc


def _write_all(fd: int, chunks: Iterable[bytes]) -> int:
    """Write every chunk to `fd`, fsync and close it; return the byte count."""
    num_bytes = 0
    with os.fdopen(fd, "wb") as out:
        for chunk in chunks:
            out.write(chunk)
            num_bytes += len(chunk)
        out.flush()
        # Data must be on disk before the rename publishes it, or a crash could expose an
        # empty or partial file under the final key.
        os.fsync(out.fileno())
    return num_bytes


def _fsync_dir(directory: Path) -> None:
    """Persist a rename by syncing its directory (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_range(
    key: str, handle: BinaryIO, start: int, end: int, chunk_bytes: int
) -> Iterator[bytes]:
    """Yield `[start, end)` of an open file in chunks, closing it at the end."""
    with handle, _os_errors(key):
        handle.seek(start)
        remaining = end - start
        while remaining > 0:
            chunk = handle.read(min(chunk_bytes, remaining))
            if not chunk:
                return
            remaining -= len(chunk)
            yield chunk
