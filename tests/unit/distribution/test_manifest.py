"""Manifest building: chunking, digests, the total digest and its JSON form."""

from __future__ import annotations

import hashlib

import pytest

from conveyor.distribution.manifest import (
    ChunkRef,
    FileEntry,
    Manifest,
    build_manifest,
    chunk_key,
    file_entry,
    split_chunks,
)


def entry(path: str, data: bytes, chunk_bytes: int = 4) -> FileEntry:
    """The entry of a file holding `data`."""
    return file_entry(path, split_chunks([data], chunk_bytes))


def test_split_chunks_regroups_pieces_to_the_chunk_size() -> None:
    pieces = [b"ab", b"cdefg", b"", b"hij"]
    assert list(split_chunks(pieces, 4)) == [b"abcd", b"efgh", b"ij"]
    assert list(split_chunks([], 4)) == []
    with pytest.raises(ValueError):
        list(split_chunks([b"x"], 0))


def test_file_entry_names_each_chunk_by_its_sha256() -> None:
    got = entry("w/model.bin", b"0123456789")
    assert got.size_bytes == 10
    assert [c.size_bytes for c in got.chunks] == [4, 4, 2]
    assert got.chunks[0].digest == hashlib.sha256(b"0123").hexdigest()


def test_total_digest_depends_on_bytes_and_paths_not_on_order_or_name() -> None:
    a, b = entry("a.bin", b"hello world"), entry("b.json", b"{}")
    first = build_manifest("m", 4, [a, b])
    assert build_manifest("other-name", 4, [b, a]).digest == first.digest
    assert [f.path for f in first.files] == ["a.bin", "b.json"]
    assert build_manifest("m", 4, [a, entry("b.json", b"{ }")]).digest != first.digest
    assert build_manifest("m", 4, [a, entry("c.json", b"{}")]).digest != first.digest


def test_manifest_round_trips_through_json_and_rejects_tampering() -> None:
    manifest = build_manifest("org/model:v1", 4, [entry("x/y.bin", b"abcdefghij")])
    assert Manifest.from_json(manifest.to_json()) == manifest
    tampered = manifest.to_json().replace('"size": 10', '"size": 11')
    with pytest.raises(ValueError, match="do not add up"):
        Manifest.from_json(tampered)


def test_unique_chunks_lists_repeated_chunks_once() -> None:
    manifest = build_manifest("m", 4, [entry("a", b"aaaaaaaa"), entry("b", b"aaaa")])
    assert len(manifest.unique_chunks()) == 1
    assert manifest.total_bytes == 12


@pytest.mark.parametrize("path", ["", "/abs", "a/../b", "a//b", "./a", "a\\b"])
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError):
        FileEntry(path, 0, ())


def test_bad_names_digests_and_duplicate_paths_are_refused() -> None:
    with pytest.raises(ValueError):
        build_manifest("-bad", 4, [])
    with pytest.raises(ValueError):
        build_manifest("m", 4, [entry("a", b"x"), entry("a", b"y")])
    with pytest.raises(ValueError):
        ChunkRef("abc", 1)
    with pytest.raises(ValueError):
        chunk_key("../etc")
    assert chunk_key("a" * 64) == "chunks/sha256/" + "a" * 64
