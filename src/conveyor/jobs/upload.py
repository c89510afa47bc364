"""Streaming uploads: a multipart/form-data body goes to the object store as it arrives.

The HTTP body is parsed incrementally; the bytes of the file part flow through a small
bounded queue to a thread that writes them with the object store's `put_stream`. Neither the
request nor the file is ever held whole in memory or spooled to a temporary file first.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from conveyor.errors import InvalidRequest
from conveyor.jobs.errors import FileTooLarge
from conveyor.stores.errors import ObjectStoreError
from conveyor.stores.object_store import ObjectStore

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FILE_FIELD = "file"
MAX_FIELD_BYTES = 64 * 1024
PIPE_CHUNKS = 8
COALESCE_BYTES = 256 * 1024
_END: Final = object()


class UploadAborted(Exception):
    """The upload stopped before its end (client error, size limit); nothing is stored."""


class ChunkPipe:
    """A bounded hand-over of chunks from the event loop to one consuming thread."""

    def __init__(self, max_chunks: int = PIPE_CHUNKS) -> None:
        """Create the pipe on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._queue: queue.Queue[object] = queue.Queue(max_chunks)
        self._space = asyncio.Event()
        self._is_aborted = False

    def chunks(self) -> Iterator[bytes]:
        """The consumer side (runs in the writer thread)."""
        while True:
            item = self._queue.get()
            self._loop.call_soon_threadsafe(self._space.set)
            if self._is_aborted:
                raise UploadAborted("the upload was aborted")
            if item is _END:
                return
            if isinstance(item, bytes):
                yield item

    async def put(self, item: object, writer: asyncio.Future[int]) -> None:
        """Hand over one item, waiting for space; fails if the writer has stopped."""
        while True:
            self._space.clear()  # before trying, so a get() after a failed try wakes us
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                pass
            if writer.done():
                writer.result()
                raise UploadAborted("the object store writer stopped early")
            space = asyncio.ensure_future(self._space.wait())
            waiting: set[asyncio.Future[Any]] = {space, writer}
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                space.cancel()

    def abort(self) -> None:
        """Make the consumer fail at its next chunk, so the store discards the object."""
        self._is_aborted = True
        # A full queue means the consumer is busy with queued chunks: it will see the flag.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_END)


async def store_stream(
    objects: ObjectStore, key: str, chunks: AsyncIterator[bytes], max_bytes: int
) -> int:
    """Write `chunks` to `key` (atomically) and return the size; FileTooLarge past `max_bytes`."""
    pipe = ChunkPipe()
    writer = asyncio.ensure_future(asyncio.to_thread(objects.put_stream, key, pipe.chunks()))
    num_bytes = 0
    try:
        async for chunk in chunks:
            num_bytes += len(chunk)
            if num_bytes > max_bytes:
                raise FileTooLarge(f"the file is larger than the limit of {max_bytes} bytes")
            await pipe.put(chunk, writer)
        await pipe.put(_END, writer)
        return await writer
    except BaseException:
        pipe.abort()
        with contextlib.suppress(UploadAborted, ObjectStoreError, OSError):
            await writer
        raise


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
