"""Manifests: which files a model has, their sizes and their chunks' SHA-256 digests.

Pure: chunking and hashing work on bytes handed in, nothing here touches a disk or network.
The manifest's own digest covers every file's path, size and chunk list, so two pushes of the
same bytes produce the same digest, and any change of a byte produces a different one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
DEFAULT_CHUNK_BYTES = 64 * MIB
MANIFEST_VERSION = 1
CHUNK_KEY_PREFIX = "chunks/sha256/"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# The same rule as model names in the config.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")


def is_digest(text: str) -> bool:
    """Whether `text` is a lowercase hex SHA-256 digest."""
    return bool(_DIGEST.match(text))


def chunk_key(digest: str) -> str:
    """The object store key of a chunk (ValueError for anything but a digest)."""
    if not is_digest(digest):
        raise ValueError(f"not a SHA-256 hex digest: {digest!r}")
    return CHUNK_KEY_PREFIX + digest


def check_model_name(name: str) -> str:
    """Return `name` if it is a valid model name, else raise ValueError."""
    if not _NAME.match(name):
        raise ValueError(f"invalid model name {name!r}: letters, digits and ._:/- only")
    return name


def check_relative_path(path: str) -> str:
    """Return `path` if it is a safe `/`-separated relative file path, else ValueError."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise ValueError(f"invalid file path in manifest: {path!r}")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"invalid file path in manifest: {path!r}")
    return path


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One chunk: its SHA-256 (hex) and its size."""

    digest: str
    size_bytes: int

    def __post_init__(self) -> None:
        """Reject a malformed digest or a negative size."""
        if not is_digest(self.digest) or self.size_bytes < 0:
            raise ValueError(f"invalid chunk {self.digest!r} of {self.size_bytes} bytes")


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a model: its relative path, size and chunks in order."""

    path: str
    size_bytes: int
    chunks: tuple[ChunkRef, ...]

    def __post_init__(self) -> None:
        """The chunks must add up to the file's size."""
        check_relative_path(self.path)
        if sum(c.size_bytes for c in self.chunks) != self.size_bytes:
            raise ValueError(f"chunks of {self.path} do not add up to {self.size_bytes} bytes")


@dataclass(frozen=True, slots=True)
class Manifest:
    """A model's files and chunks under a name, with the digest of the whole listing."""

    name: str
    chunk_bytes: int
    files: tuple[FileEntry, ...]
    digest: str

    @property
    def total_bytes(self) -> int:
        """The size of the model's files together."""
        return sum(f.size_bytes for f in self.files)

    def unique_chunks(self) -> list[ChunkRef]:
        """Every distinct chunk once, in first-use order (equal chunks are stored once)."""
        seen: dict[str, ChunkRef] = {}
        for entry in self.files:
            for chunk in entry.chunks:
                seen.setdefault(chunk.digest, chunk)
        return list(seen.values())

    def to_json(self) -> str:
        """The manifest as canonical JSON text (what the job store keeps)."""
        return json.dumps(_listing(self.name, self.chunk_bytes, self.files), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse and check a manifest; ValueError when its digest does not match its files."""
        raw: Any = json.loads(text)
        if raw.get("version") != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {raw.get('version')!r}")
        files = tuple(
            FileEntry(f["path"], int(f["size"]), tuple(ChunkRef(d, int(s)) for d, s in f["chunks"]))
            for f in raw["files"]
        )
        return build_manifest(raw["name"], int(raw["chunk_bytes"]), files)


def build_manifest(name: str, chunk_bytes: int, files: Sequence[FileEntry]) -> Manifest:
    """The manifest of `files` (sorted by path) under `name`, with its total digest."""
    check_model_name(name)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    ordered = tuple(sorted(files, key=lambda f: f.path))
    paths = [f.path for f in ordered]
    if len(set(paths)) != len(paths):
        raise ValueError("a manifest lists each file path once")
    # The digest covers the files only, so renaming a model keeps its digest.
    body = json.dumps(_listing("", chunk_bytes, ordered)["files"], sort_keys=True)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return Manifest(name=name, chunk_bytes=chunk_bytes, files=ordered, digest=digest)


def _listing(name: str, chunk_bytes: int, files: Iterable[FileEntry]) -> dict[str, Any]:
    """The JSON-ready form of a manifest."""
    return {
        "version": MANIFEST_VERSION,
        "name": name,
        "chunk_bytes": chunk_bytes,
        "files": [
            {
                "path": f.path,
                "size": f.size_bytes,
                "chunks": [[c.digest, c.size_bytes] for c in f.chunks],
            }
            for f in files
        ],
    }


def split_chunks(pieces: Iterable[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """Regroup a byte stream into chunks of exactly `chunk_bytes` (the last may be shorter)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    buffer = bytearray()
    for piece in pieces:
        buffer += piece
        while len(buffer) >= chunk_bytes:
            yield bytes(buffer[:chunk_bytes])
            del buffer[:chunk_bytes]
    if buffer:
        yield bytes(buffer)


def chunk_ref(data: bytes) -> ChunkRef:
    """The reference (digest, size) of one chunk's bytes."""
    return ChunkRef(hashlib.sha256(data).hexdigest(), len(data))


def file_entry(path: str, chunks: Iterable[bytes]) -> FileEntry:
    """The entry of a file whose bytes are `chunks` (already split to the chunk size)."""
    refs = tuple(chunk_ref(chunk) for chunk in chunks)
    return FileEntry(path, sum(r.size_bytes for r in refs), refs)
