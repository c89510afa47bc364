"""A disk that fills up: the `os` module as the local object store sees it, except that files
opened from a descriptor refuse to grow past a capacity, as on a full disk or quota."""

from __future__ import annotations

import errno
import os
from types import TracebackType
from typing import IO, Any


class FullFile:
    """A binary file that writes what fits in the capacity left, then fails with `errno_code`."""

    def __init__(self, file: IO[bytes], disk: FullDisk) -> None:
        self._file = file
        self._disk = disk

    def write(self, data: bytes) -> int:
        room = max(self._disk.capacity_bytes - self._disk.num_written, 0)
        if len(data) > room:
            self._file.write(data[:room])
            self._file.flush()  # the partial bytes are really on disk
            self._disk.num_written += room
            raise OSError(self._disk.errno_code, os.strerror(self._disk.errno_code))
        self._disk.num_written += len(data)
        return self._file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> FullFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._file.close()


class FullDisk:
    """Stands in for `os` (monkeypatch it onto the object store module)."""

    def __init__(self, capacity_bytes: int, errno_code: int = errno.ENOSPC) -> None:
        self.capacity_bytes = capacity_bytes
        self.errno_code = errno_code
        self.num_written = 0

    def fdopen(self, fd: int, mode: str = "rb", *args: Any, **kwargs: Any) -> FullFile:
        return FullFile(os.fdopen(fd, mode, *args, **kwargs), self)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)
