"""The KV tier's disk blocks, written off the engine thread.

A block demoted to disk is copied out of its host slot at once (the slot is about to take
another block), and a single writer thread puts those bytes in a file. Until the file is
written, a restore of the block reads the bytes still held in memory, so the engine
thread never waits for the disk on a write. Writes and deletes run in the order they were
asked for. A write that fails leaves the block missing: its restore raises ``OSError``,
which the engine treats as any failed copy (the tier forgets everything, the step's
requests get an error, later ones recompute).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["DiskBlocks"]


class DiskBlocks:
    """Raw block files under a directory this object creates and removes."""

    def __init__(self, parent: str | Path, block_bytes: int) -> None:
        """A new directory under ``parent`` for blocks of ``block_bytes`` bytes."""
        Path(parent).mkdir(parents=True, exist_ok=True)
        self.directory = Path(tempfile.mkdtemp(prefix="kv-", dir=parent))
        self.block_bytes = block_bytes
        self._lock = threading.Lock()
        self._unwritten: dict[bytes, bytes] = {}
        self._failed: set[bytes] = set()
        # Deletes asked for and not yet done, per block: its old file must not be read.
        self._deleting: dict[bytes, int] = {}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kv-disk")

    def write(self, digest: bytes, raw: bytes) -> None:
        """Store ``raw`` as block ``digest``: readable at once, on disk soon after."""
        if len(raw) != self.block_bytes:
            raise ValueError(f"a block is {self.block_bytes} bytes, got {len(raw)}")
        with self._lock:
            self._unwritten[digest] = raw
            self._failed.discard(digest)
        self._writer.submit(self._write_file, digest, raw)

    def read(self, digest: bytes) -> bytearray:
        """Block ``digest``'s bytes; OSError when it is gone or its write failed."""
        with self._lock:
            raw = self._unwritten.get(digest)
            if raw is None and (digest in self._failed or digest in self._deleting):
                raise OSError(f"disk block {digest.hex()} was not written or was discarded")
        if raw is None:
            raw = self.path(digest).read_bytes()
        if len(raw) != self.block_bytes:
            raise OSError(f"disk block {digest.hex()} has {len(raw)} bytes, not {self.block_bytes}")
        return bytearray(raw)

    def discard(self, digest: bytes) -> None:
        """Forget block ``digest`` (its file is deleted after any write still queued)."""
        with self._lock:
            self._unwritten.pop(digest, None)
            self._failed.discard(digest)
            self._deleting[digest] = self._deleting.get(digest, 0) + 1
        self._writer.submit(self._delete_file, digest)

    def flush(self) -> None:
        """Wait until every write and delete asked for so far is done."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        """Finish queued work, then remove the directory."""
        self._writer.shutdown(wait=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def path(self, digest: bytes) -> Path:
        """The file of block ``digest``."""
        return self.directory / f"{digest.hex()}.kv"

    def _delete_file(self, digest: bytes) -> None:
        """On the writer thread: remove the file; the block may be read again after."""
        self.path(digest).unlink(missing_ok=True)
        with self._lock:
            left = self._deleting.pop(digest) - 1
            if left:
                self._deleting[digest] = left

    def _write_file(self, digest: bytes, raw: bytes) -> None:
        """On the writer thread: write atomically (a temporary name, then renamed)."""
        path = self.path(digest)
        partial = path.with_suffix(".part")
        try:
            partial.write_bytes(raw)
            partial.replace(path)
        except OSError:
            with self._lock:
                if self._unwritten.get(digest) is raw:
                    self._failed.add(digest)
            partial.unlink(missing_ok=True)
        finally:
            with self._lock:
                if self._unwritten.get(digest) is raw:
                    del self._unwritten[digest]
