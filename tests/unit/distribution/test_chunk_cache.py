"""The local chunk cache: only verified chunks land, assembly re-verifies, eviction frees."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conveyor.distribution.chunk_cache import ChunkCache
from conveyor.distribution.errors import CorruptChunk
from conveyor.distribution.manifest import build_manifest, file_entry, split_chunks


def digest(data: bytes) -> str:
    """SHA-256 hex."""
    return hashlib.sha256(data).hexdigest()


def test_a_chunk_lands_only_when_its_bytes_match(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path)
    good = b"weights!"
    with pytest.raises(CorruptChunk, match="wrong SHA-256"):
        cache.write_chunk(digest(good), len(good), [b"weights?"])
    with pytest.raises(CorruptChunk, match="expected 8"):
        cache.write_chunk(digest(good), len(good), [b"weigh"])  # truncated
    with pytest.raises(CorruptChunk, match="more than"):
        cache.write_chunk(digest(good), len(good), [good, b"extra"])
    assert not cache.has_chunk(digest(good))
    assert list(cache.tmp_dir.iterdir()) == []
    assert cache.write_chunk(digest(good), len(good), [b"weig", b"hts!"]) == 8
    assert cache.held_chunks() == {digest(good)}


def test_opening_drops_half_written_chunks(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path)
    (cache.tmp_dir / "partial").write_bytes(b"half")
    ChunkCache(tmp_path)
    assert not (cache.tmp_dir / "partial").exists()


def test_assemble_builds_files_and_catches_a_chunk_damaged_on_disk(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path)
    data = {"config.json": b"{}", "w/model.bin": b"0123456789"}
    entries = [file_entry(p, split_chunks([d], 4)) for p, d in data.items()]
    manifest = build_manifest("m", 4, entries)
    for chunk in manifest.unique_chunks():
        source = b"".join(data.values())
        piece = next(
            source[i : i + chunk.size_bytes]
            for i in range(len(source))
            if digest(source[i : i + chunk.size_bytes]) == chunk.digest
        )
        cache.write_chunk(chunk.digest, chunk.size_bytes, [piece])
    bad = manifest.files[1].chunks[1].digest
    cache.chunk_path(bad).write_bytes(b"XXXX")
    with pytest.raises(CorruptChunk) as caught:
        cache.assemble(manifest)
    assert caught.value.digest == bad and not cache.has_chunk(bad)
    assert not cache.is_assembled(manifest)
    cache.write_chunk(bad, 4, [b"4567"])
    root = cache.assemble(manifest)
    assert (root / "w/model.bin").read_bytes() == data["w/model.bin"]
    assert cache.is_assembled(manifest)
    [cached] = cache.cached_models(pinned=set())
    assert cached.key == manifest.digest and cached.chunks == {
        c.digest for c in manifest.unique_chunks()
    }
    cache.evict(cached.key, keep_chunks=set())
    assert cache.held_chunks() == set() and not cache.is_assembled(manifest)
