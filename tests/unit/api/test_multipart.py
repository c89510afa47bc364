"""Multipart parsing of uploads: every malformed body is a 400, never a crash or a pass."""

from __future__ import annotations

import pytest

from conveyor.api.multipart import MultipartStream
from conveyor.errors import InvalidRequest

CONTENT_TYPE = "multipart/form-data; boundary=b"
FILE_HEAD = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'


def parse(body: bytes) -> tuple[MultipartStream, bytes]:
    stream = MultipartStream(CONTENT_TYPE)
    data = stream.feed(body)
    stream.finish()
    return stream, data


def test_a_well_formed_body_yields_its_file() -> None:
    stream, data = parse(FILE_HEAD + b"line\r\n--b--\r\n")
    assert data == b"line"
    assert stream.filename == "a.jsonl"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"no boundary anywhere", "malformed"),
        (b"--b\r\ngarbage\r\n\r\n", "malformed"),
        (b"--b\r\n\x00\x00: x\r\n\r\n", "malformed"),
        (FILE_HEAD + b"line", "closing boundary"),  # cut off mid-file
        (FILE_HEAD + b"line\r\n--b-", "closing boundary"),
        (
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b--\r\n',
            "file",
        ),
    ],
)
def test_a_malformed_body_is_a_400(body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(body)
    assert fragment in info.value.message


def test_a_content_type_without_boundary_is_a_400() -> None:
    with pytest.raises(InvalidRequest):
        MultipartStream("multipart/form-data")
