"""The local model cache on disk: verified chunks and the model directories built from them.

Layout under the cache root:

- `chunks/<sha256>`: a chunk, present only once its bytes matched its digest;
- `tmp/`: chunks being written; emptied on open, so a killed pull leaves nothing half-written
  where a reader could find it;
- `models/<manifest digest>/`: the assembled files, complete once `.complete` exists, and
  `.last-used` whose mtime orders eviction.

Every write goes to `tmp/` first and is renamed into place after its digest checked out, so a
chunk file is never truncated or wrong (short of disk corruption, which `assemble` catches:
it hashes every chunk again while copying it into the model's files).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from conveyor.distribution.disk_budget import CachedModel
from conveyor.distribution.errors import CorruptChunk
from conveyor.distribution.manifest import Manifest, check_relative_path, is_digest

READ_BYTES = 1024 * 1024
COMPLETE_MARKER = ".complete"
LAST_USED_MARKER = ".last-used"
CHUNKS_FILE = ".chunks"


class ChunkCache:
    """Verified chunks and assembled models under one directory."""

    def __init__(self, root: Path) -> None:
        """Open (creating) the cache at `root` and drop any half-written chunk."""
        self.root = root
        self.chunks_dir = root / "chunks"
        self.models_dir = root / "models"
        self.tmp_dir = root / "tmp"
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        for directory in (self.chunks_dir, self.models_dir, self.tmp_dir):
            directory.mkdir(parents=True, exist_ok=True)

    def chunk_path(self, digest: str) -> Path:
        """Where a verified chunk lives (ValueError for anything but a digest)."""
        if not is_digest(digest):
            raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
        return self.chunks_dir / digest

    def has_chunk(self, digest: str) -> bool:
        """Whether a verified chunk is on disk."""
        return self.chunk_path(digest).is_file()

    def held_chunks(self) -> set[str]:
        """Every verified chunk on disk."""
        return {p.name for p in self.chunks_dir.iterdir() if is_digest(p.name)}

    def chunk_sizes(self) -> dict[str, int]:
        """The size of every verified chunk on disk."""
        return {d: self.chunk_path(d).stat().st_size for d in self.held_chunks()}

    def write_chunk(self, digest: str, size_bytes: int, pieces: Iterable[bytes]) -> int:
        """Write a chunk from `pieces` if they hash to `digest`; CorruptChunk otherwise.

        Stops reading once more than `size_bytes` arrived (a peer sending too much).
        """
        target = self.chunk_path(digest)
        tmp = self.tmp_dir / f"{digest}.{secrets.token_hex(4)}"
        hasher = hashlib.sha256()
        written = 0
        try:
            with tmp.open("wb") as out:
                for piece in pieces:
                    written += len(piece)
                    if written > size_bytes:
                        raise CorruptChunk(digest, f"more than the expected {size_bytes} bytes")
                    hasher.update(piece)
                    out.write(piece)
                out.flush()
                os.fsync(out.fileno())
            _check(digest, size_bytes, written, hasher.hexdigest())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return written

    def drop_chunk(self, digest: str) -> None:
        """Delete a chunk (found corrupt, or no longer needed)."""
        self.chunk_path(digest).unlink(missing_ok=True)

    def model_dir(self, manifest: Manifest) -> Path:
        """Where the manifest's files are assembled."""
        return self.models_dir / manifest.digest

    def is_assembled(self, manifest: Manifest) -> bool:
        """Whether the manifest's files are complete on disk."""
        return (self.model_dir(manifest) / COMPLETE_MARKER).is_file()

    def assemble(self, manifest: Manifest) -> Path:
        """Build the model's files from its chunks, hashing each chunk again on the way.

        A chunk whose bytes no longer match is deleted and reported as CorruptChunk, so the
        caller fetches it again. Returns the model directory.
        """
        target = self.model_dir(manifest)
        staging = self.tmp_dir / f"model-{manifest.digest}-{secrets.token_hex(4)}"
        try:
            for entry in manifest.files:
                path = staging / check_relative_path(entry.path)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("wb") as out:
                    for chunk in entry.chunks:
                        self._copy_verified(chunk.digest, chunk.size_bytes, out)
            chunk_list = "\n".join(c.digest for c in manifest.unique_chunks())
            (staging / CHUNKS_FILE).write_text(chunk_list)
            (staging / COMPLETE_MARKER).write_text(manifest.name)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.touch(manifest)
        return target

    def _copy_verified(self, digest: str, size_bytes: int, out: IO[bytes]) -> None:
        """Append a chunk's bytes to `out`, checking them against the digest."""
        hasher = hashlib.sha256()
        written = 0
        try:
            with self.chunk_path(digest).open("rb") as source:
                while block := source.read(READ_BYTES):
                    hasher.update(block)
                    out.write(block)
                    written += len(block)
            _check(digest, size_bytes, written, hasher.hexdigest())
        except (CorruptChunk, FileNotFoundError) as exc:
            self.drop_chunk(digest)
            raise CorruptChunk(digest, "missing or damaged in the local cache") from exc

    def touch(self, manifest: Manifest) -> None:
        """Record a use of the model (for LRU eviction)."""
        (self.model_dir(manifest) / LAST_USED_MARKER).touch()

    def cached_models(self, pinned: set[str]) -> list[CachedModel]:
        """The complete models on disk, for the disk budget (`pinned`: manifest digests)."""
        models = []
        for directory in self.models_dir.iterdir():
            marker = directory / LAST_USED_MARKER
            if not (directory / COMPLETE_MARKER).is_file() or not marker.is_file():
                continue
            chunks = frozenset((directory / CHUNKS_FILE).read_text().split())
            size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
            models.append(
                CachedModel(
                    directory.name, size, chunks, marker.stat().st_mtime, directory.name in pinned
                )
            )
        return models

    def evict(self, key: str, keep_chunks: set[str]) -> None:
        """Delete a model directory and its chunks that no kept model uses."""
        directory = self.models_dir / key
        chunks_file = directory / CHUNKS_FILE
        chunks = set(chunks_file.read_text().split()) if chunks_file.is_file() else set()
        shutil.rmtree(directory, ignore_errors=True)
        for digest in chunks - keep_chunks:
            self.drop_chunk(digest)


def _check(digest: str, size_bytes: int, written: int, actual: str) -> None:
    """CorruptChunk unless the bytes had the expected size and digest."""
    if written != size_bytes:
        raise CorruptChunk(digest, f"{written} bytes, expected {size_bytes}")
    if actual != digest:
        raise CorruptChunk(digest, f"wrong SHA-256 {actual}")
