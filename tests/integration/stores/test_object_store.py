"""Object store behaviour, run against a local directory and an in-process S3 mock (moto)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.stores.errors import ObjectNotFoundError
from conveyor.stores.local_store import LocalDirObjectStore
from conveyor.stores.object_io import lines_of
from conveyor.stores.object_store import ObjectStore, open_object_store
from conveyor.stores.s3_store import MIN_S3_PART_BYTES, S3ObjectStore

DATA = b'{"a": 1}\n\n{"b": 22}\n{"c": 333}'
BUCKET = "conveyor-test-bucket"


class Boom(RuntimeError):
    """Raised by a chunk source to simulate a client or network failure mid-upload."""


def chunked(data: bytes, chunk_bytes: int) -> Iterator[bytes]:
    """Yield `data` in pieces of `chunk_bytes`."""
    for offset in range(0, len(data), chunk_bytes):
        yield data[offset : offset + chunk_bytes]


def failing_after(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Yield every chunk, then fail before the stream ends."""
    yield from chunks
    raise Boom("upload interrupted")


@pytest.fixture
def s3_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A boto3 S3 client talking to moto's in-process mock, with a fresh bucket."""
    moto = pytest.importorskip("moto", reason="moto[s3] is needed for the S3 tests")
    boto3 = pytest.importorskip("boto3", reason="boto3 is needed for the S3 tests")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture(params=["local", "s3"])
def object_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Each object store implementation, empty."""
    if request.param == "local":
        return LocalDirObjectStore(tmp_path / "objects")
    client = request.getfixturevalue("s3_client")
    return S3ObjectStore(BUCKET, "prefix/", client=client)


def read_all(chunks: Iterator[bytes]) -> bytes:
    """Join a chunk stream."""
    return b"".join(chunks)


def test_put_stream_round_trips(object_store: ObjectStore) -> None:
    """Streamed writes read back whole, in bounded chunks, and overwrite."""
    key = "tenant-a/file-1/input.jsonl"

    assert object_store.put_stream(key, chunked(DATA, 3)) == len(DATA)
    assert object_store.exists(key)
    assert object_store.size(key) == len(DATA)
    assert read_all(object_store.iter_chunks(key, chunk_bytes=4)) == DATA
    assert all(len(c) <= 4 for c in object_store.iter_chunks(key, chunk_bytes=4))
    # Overwriting replaces the object whole.
    assert object_store.put_stream(key, [b"new"]) == 3
    assert read_all(object_store.iter_chunks(key)) == b"new"


def test_empty_object(object_store: ObjectStore) -> None:
    """Zero-byte objects work end to end."""
    assert object_store.put_stream("empty", []) == 0
    assert object_store.size("empty") == 0
    assert read_all(object_store.iter_chunks("empty")) == b""
    assert list(object_store.read_lines("empty", 0, 0)) == []


@pytest.mark.parametrize(
    ("start", "end"),
    [(0, len(DATA)), (0, 1), (3, 12), (9, 10), (len(DATA) - 2, len(DATA) + 50), (5, 5)],
)
def test_open_range_reads_half_open_ranges(object_store: ObjectStore, start: int, end: int) -> None:
    """Range reads return exactly `[start, end)`, clamped at the end."""
    object_store.put_stream("obj", [DATA])

    assert read_all(object_store.open_range("obj", start, end, chunk_bytes=2)) == DATA[start:end]


def test_open_range_past_the_end_is_empty_and_bad_ranges_raise(object_store: ObjectStore) -> None:
    """Reads past the end are empty; inverted or negative ranges raise."""
    object_store.put_stream("obj", [DATA])

    assert read_all(object_store.open_range("obj", len(DATA) + 5, len(DATA) + 9)) == b""
    with pytest.raises(ValueError):
        object_store.open_range("obj", 5, 4)
    with pytest.raises(ValueError):
        object_store.open_range("obj", -1, 4)


def test_read_lines_of_line_aligned_ranges(object_store: ObjectStore) -> None:
    """Lines of a shard's byte range come back without terminators, blanks kept."""
    object_store.put_stream("input.jsonl", [DATA])
    second_start = DATA.index(b"\n\n") + 1  # the empty line starts here
    third_start = DATA.index(b'{"b"')

    assert list(object_store.read_lines("input.jsonl", 0, len(DATA))) == [
        b'{"a": 1}',
        b"",
        b'{"b": 22}',
        b'{"c": 333}',
    ]
    assert list(object_store.read_lines("input.jsonl", second_start, third_start)) == [b""]
    assert list(object_store.read_lines("input.jsonl", third_start, len(DATA))) == [
        b'{"b": 22}',
        b'{"c": 333}',
    ]


def test_missing_keys(object_store: ObjectStore) -> None:
    """Missing keys raise ObjectNotFoundError or answer False."""
    assert not object_store.exists("nope")
    assert not object_store.delete("nope")
    with pytest.raises(ObjectNotFoundError):
        object_store.size("nope")
    with pytest.raises(ObjectNotFoundError):
        object_store.open_range("nope", 0, 10)
    with pytest.raises(ObjectNotFoundError):
        read_all(object_store.iter_chunks("nope"))


def test_delete(object_store: ObjectStore) -> None:
    """Deleting removes the object."""
    object_store.put_stream("a/b", [b"x"])

    assert object_store.delete("a/b")
    assert not object_store.exists("a/b")


def test_interrupted_put_leaves_the_previous_object(object_store: ObjectStore) -> None:
    """A failed write never replaces or creates the key."""
    object_store.put_stream("kept", [b"old"])

    with pytest.raises(Boom):
        object_store.put_stream("kept", failing_after(chunked(DATA, 4)))
    with pytest.raises(Boom):
        object_store.put_stream("never", failing_after(chunked(DATA, 4)))
    assert read_all(object_store.iter_chunks("kept")) == b"old"
    assert not object_store.exists("never")


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "../x", "a/./b", ".hidden", "a\\b"])
def test_invalid_keys_are_rejected(object_store: ObjectStore, key: str) -> None:
    """Keys that could escape the root or clash with temp files are rejected."""
    with pytest.raises(ValueError):
        object_store.put_stream(key, [b"x"])


def test_local_put_leaves_no_temp_files(tmp_path: Path) -> None:
    """A failed local write removes its temp file."""
    store = LocalDirObjectStore(tmp_path)
    store.put_stream("dir/ok", [b"fine"])

    with pytest.raises(Boom):
        store.put_stream("dir/broken", failing_after(iter([b"partial"])))
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["ok"]


def test_s3_large_stream_uses_multipart_upload(s3_client: Any) -> None:
    """Streams above one part go up as a multipart upload, read back intact."""
    store = S3ObjectStore(BUCKET, "big", client=s3_client, part_bytes=MIN_S3_PART_BYTES)
    block = bytes(range(256)) * 4096  # 1 MiB
    num_blocks = 11
    boundary = MIN_S3_PART_BYTES

    assert store.put_stream("large", (block for _ in range(num_blocks))) == num_blocks * len(block)
    head = s3_client.head_object(Bucket=BUCKET, Key="big/large")
    # Multipart ETags end in "-<number of parts>": 11 MiB in 5 MiB parts is 3 parts.
    assert head["ETag"].strip('"').endswith("-3")
    window = read_all(store.open_range("large", boundary - 10, boundary + 10))
    assert window == (block * num_blocks)[boundary - 10 : boundary + 10]


def test_s3_interrupted_multipart_upload_is_aborted(s3_client: Any) -> None:
    """A failed multipart upload is aborted, leaving no parts behind."""
    store = S3ObjectStore(BUCKET, client=s3_client, part_bytes=MIN_S3_PART_BYTES)
    block = b"x" * (1024 * 1024)

    with pytest.raises(Boom):
        store.put_stream("half", failing_after(block for _ in range(6)))
    assert not store.exists("half")
    assert s3_client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_s3_rejects_parts_below_the_s3_minimum(s3_client: Any) -> None:
    """Part sizes S3 would refuse are rejected up front."""
    with pytest.raises(ValueError):
        S3ObjectStore(BUCKET, client=s3_client, part_bytes=MIN_S3_PART_BYTES - 1)


def test_lines_of_handles_any_chunking() -> None:
    """Line splitting does not depend on where chunks break."""
    expected = [b'{"a": 1}', b"", b'{"b": 22}', b'{"c": 333}']

    for chunk_bytes in range(1, len(DATA) + 1):
        assert list(lines_of(chunked(DATA, chunk_bytes))) == expected
    assert list(lines_of([b"a\n", b"b\n"])) == [b"a", b"b"]
    assert list(lines_of([b"\n"])) == [b""]


def test_open_object_store_local_urls(tmp_path: Path) -> None:
    """Plain paths and file:// URLs open local stores."""
    plain = open_object_store(str(tmp_path / "plain"))
    as_url = open_object_store(f"file://{tmp_path}/url")

    assert isinstance(plain, LocalDirObjectStore)
    assert plain.root == tmp_path / "plain"
    assert isinstance(as_url, LocalDirObjectStore)
    assert as_url.root == tmp_path / "url"
    with pytest.raises(ValueError):
        open_object_store("ftp://host/dir")


def test_open_object_store_s3_url(s3_client: Any) -> None:
    """s3:// URLs open an S3 store using the prefix."""
    store = open_object_store(f"s3://{BUCKET}/some/prefix?region=us-east-1")

    assert isinstance(store, S3ObjectStore)
    store.put_stream("k", [b"v"])
    assert s3_client.get_object(Bucket=BUCKET, Key="some/prefix/k")["Body"].read() == b"v"
    with pytest.raises(ValueError):
        open_object_store(f"s3://{BUCKET}?colour=blue")
