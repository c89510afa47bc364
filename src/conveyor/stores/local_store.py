"""The local-directory object store: one file per object, written atomically.

See `object_store` for the contract. OSErrors are translated: a missing file is
`ObjectNotFoundError`, any other (disk full, I/O error, read-only disk) is
`ObjectStoreUnavailableError`, the API's 503.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from conveyor.stores.errors import (
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
)
from conveyor.stores.object_io import (
    DEFAULT_CHUNK_BYTES,
    check_chunk_bytes,
    check_range,
    lines_of,
    validate_key,
)


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
