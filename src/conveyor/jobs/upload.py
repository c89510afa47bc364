"""Streaming uploads: a file's bytes go to the object store as they arrive.

The bytes (the file part of an HTTP body, parsed incrementally by `api.multipart`) flow
through a small bounded queue to a thread that writes them with the object store's
`put_stream`. Neither the request nor the file is ever held whole in memory or spooled to
a temporary file first.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

from conveyor.jobs.errors import FileTooLarge
from conveyor.stores.errors import ObjectStoreError
from conveyor.stores.object_store import ObjectStore

PIPE_CHUNKS = 8
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
