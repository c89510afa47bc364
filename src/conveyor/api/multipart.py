"""Incremental multipart/form-data parsing of an upload: small fields kept, the file streamed.

HTTP-only: the file part's bytes are handed on in chunks (to `jobs.upload.store_stream`), so
an upload is never held whole in memory. Every malformed body is a 400.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from conveyor.errors import InvalidRequest

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FILE_FIELD = "file"
MAX_FIELD_BYTES = 64 * 1024
COALESCE_BYTES = 256 * 1024


@dataclass(slots=True)
class _Part:
    """The part being parsed: its headers, then its name."""

    headers: dict[str, str] = field(default_factory=dict)
    header_name: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)
    name: str = ""
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)

    @property
    def is_file(self) -> bool:
        """Whether this is the `file` part."""
        return self.name == FILE_FIELD and self.filename is not None


class MultipartStream:
    """Incremental multipart/form-data parsing: small fields are kept, the file streamed."""

    def __init__(
        self, content_type: str, before_file: Callable[[dict[str, str]], None] | None = None
    ) -> None:
        """Parse a body sent with `content_type` (which carries the boundary).

        `before_file` sees the fields sent ahead of the file, so it can refuse the upload
        before any file byte is stored.
        """
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise InvalidRequest("the upload must be multipart/form-data with a boundary")
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self._num_files = 0
        self._part = _Part()
        self._file_data: list[bytes] = []
        self._before_file = before_file
        self._parser = MultipartParser(boundary, self._callbacks())

    def _callbacks(self) -> MultipartCallbacks:
        """The parser's callbacks, bound to this stream."""
        return {
            "on_part_begin": self._on_part_begin,
            "on_header_field": lambda d, s, e: self._part.header_name.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._part.header_value.extend(d[s:e]),
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
        }

    def _on_part_begin(self) -> None:
        self._part = _Part()

    def _on_header_end(self) -> None:
        part = self._part
        name = part.header_name.decode("latin-1").strip().lower()
        part.headers[name] = part.header_value.decode("latin-1").strip()
        part.header_name.clear()
        part.header_value.clear()

    def _on_headers_finished(self) -> None:
        part = self._part
        _, options = parse_options_header(part.headers.get("content-disposition", ""))
        part.name = options.get(b"name", b"").decode("utf-8", "replace")
        raw_filename = options.get(b"filename")
        part.filename = None if raw_filename is None else raw_filename.decode("utf-8", "replace")
        if part.is_file:
            self._num_files += 1
            if self._num_files > 1:
                raise InvalidRequest("send exactly one 'file' part", param="file")
            self.filename = part.filename
            if self._before_file is not None:
                self._before_file(self.fields)

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        if part.is_file:
            self._file_data.append(data[start:end])
        elif len(part.data) + end - start > MAX_FIELD_BYTES:
            raise InvalidRequest(f"form field {part.name!r} is too long", param=part.name)
        else:
            part.data.extend(data[start:end])

    def _on_part_end(self) -> None:
        part = self._part
        if not part.is_file:
            self.fields[part.name] = part.data.decode("utf-8", "replace")

    def feed(self, chunk: bytes) -> bytes:
        """Parse the next body chunk; return the file bytes it held (400 if malformed)."""
        try:
            self._parser.write(chunk)
        except MultipartParseError as exc:
            raise InvalidRequest(f"the multipart body is malformed: {exc}") from None
        data = b"".join(self._file_data)
        self._file_data.clear()
        return data

    def finish(self) -> None:
        """End of body: fail if it was truncated or had no file."""
        self._parser.finalize()
        # The parser itself accepts a body cut off before its closing boundary.
        if self._parser.state != MultipartState.END:
            raise InvalidRequest("the multipart body ends before its closing boundary")
        if self._num_files != 1:
            raise InvalidRequest("missing the 'file' part", param="file")

    async def file_chunks(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Feed the HTTP body and yield the file's bytes in chunks of about 256 KiB."""
        pending: list[bytes] = []
        num_pending = 0
        async for chunk in body:
            data = self.feed(chunk)
            if data:
                pending.append(data)
                num_pending += len(data)
            if num_pending >= COALESCE_BYTES:
                yield b"".join(pending)
                pending, num_pending = [], 0
        self.finish()
        if pending:
            yield b"".join(pending)
