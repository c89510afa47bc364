"""Push a model directory as chunks, remove a pushed model: the blocking side of `models`.

Each file is read in chunks of `chunk_bytes`, each chunk named by its SHA-256 and uploaded to
the object store unless an object of that name is already there (so a new version of a model
uploads only the chunks that changed); the manifest is recorded last, so a pull never sees a
manifest whose chunks are not all uploaded yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conveyor.distribution.manifest import (
    ChunkRef,
    FileEntry,
    Manifest,
    build_manifest,
    chunk_key,
    chunk_ref,
    split_chunks,
)
from conveyor.stores.model_records import ManifestRecord
from conveyor.stores.object_store import ObjectStore
from conveyor.stores.protocols import ModelStore

READ_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PushResult:
    """What a push did: the manifest, chunks uploaded and chunks already there."""

    manifest: Manifest
    num_uploaded: int
    num_reused: int
    uploaded_bytes: int


def model_files(directory: Path) -> list[tuple[str, Path]]:
    """Every regular file under `directory` as (relative POSIX path, path), sorted."""
    if not directory.is_dir():
        raise ValueError(f"model directory {directory} does not exist")
    files = [p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()]
    if not files:
        raise ValueError(f"model directory {directory} has no files")
    return sorted((p.relative_to(directory).as_posix(), p) for p in files)


def push_model(
    directory: Path,
    name: str,
    store: ModelStore,
    objects: ObjectStore,
    *,
    chunk_bytes: int,
    now: float,
) -> PushResult:
    """Upload the directory's new chunks and record its manifest under `name`."""
    entries: list[FileEntry] = []
    counts = [0, 0, 0]  # uploaded, reused, uploaded bytes
    for relative, path in model_files(directory):
        refs = [_store_chunk(objects, chunk, counts) for chunk in _read_chunks(path, chunk_bytes)]
        entries.append(FileEntry(relative, sum(r.size_bytes for r in refs), tuple(refs)))
    manifest = build_manifest(name, chunk_bytes, entries)
    record = ManifestRecord(name, manifest.digest, manifest.total_bytes, manifest.to_json(), now)
    store.put_manifest(record)
    return PushResult(manifest, counts[0], counts[1], counts[2])


def _read_chunks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
    """A file's bytes in chunks of `chunk_bytes`."""
    with path.open("rb") as handle:
        yield from split_chunks(iter(lambda: handle.read(READ_BYTES), b""), chunk_bytes)


def _store_chunk(objects: ObjectStore, data: bytes, counts: list[int]) -> ChunkRef:
    """Upload one chunk unless it is already stored; count what happened."""
    ref = chunk_ref(data)
    key = chunk_key(ref.digest)
    if objects.exists(key):
        counts[1] += 1
    else:
        objects.put_stream(key, [data])
        counts[0] += 1
        counts[2] += len(data)
    return ref


def remove_model(name: str, store: ModelStore, objects: ObjectStore) -> int | None:
    """Forget a pushed model and delete its chunks no other model uses.

    Returns the number of chunks deleted, or None when no model has that name. A push of a
    model sharing chunks that runs at the same moment may lose them; push it again then.
    """
    record = store.get_manifest(name)
    if record is None or not store.delete_manifest(name):
        return None
    removed = {c.digest for c in Manifest.from_json(record.manifest_json).unique_chunks()}
    for other in store.list_manifests():
        kept = Manifest.from_json(other.manifest_json).unique_chunks()
        removed -= {c.digest for c in kept}
    return sum(1 for digest in sorted(removed) if objects.delete(chunk_key(digest)))
