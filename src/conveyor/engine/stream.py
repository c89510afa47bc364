"""The caller's end of one or more engine requests: an async iterator of outputs.

The engine thread never touches a stream directly: it hands batches of outputs to the
stream's event loop with ``loop.call_soon_threadsafe`` (see :func:`deliver_threadsafe`),
and everything below runs on that loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from conveyor.engine.outputs import GenerationOutput
from conveyor.errors import ConveyorError, DeadlineExceeded

__all__ = ["GenerationStream", "deliver_threadsafe"]

log = logging.getLogger(__name__)

_Item = GenerationOutput | ConveyorError


class GenerationStream:
    """Outputs of ``num_requests`` engine requests (several prompts share one stream).

    Iterate with ``async for output in stream``; it ends after every request's last
    output and raises the first error any of them met. :meth:`close` (idempotent) makes
    the stream ignore anything still coming and calls ``on_abort`` once if a request
    had not finished, so the engine frees its blocks. Create it on the event loop.
    """

    def __init__(self, num_requests: int = 1) -> None:
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests}")
        self.loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._num_open = num_requests
        self._num_outputs = 0
        self._is_closed = False
        self._on_abort: Callable[[], None] | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None

    @property
    def is_finished(self) -> bool:
        """Whether every request has delivered its last output."""
        return self._num_open == 0

    @property
    def is_closed(self) -> bool:
        """Whether the stream was closed (by the caller, an error, or its deadline)."""
        return self._is_closed

    def set_on_abort(self, on_abort: Callable[[], None]) -> None:
        """What :meth:`close` calls when requests are still unfinished."""
        self._on_abort = on_abort

    def set_deadline(self, deadline: float) -> None:
        """Fail with 504 if no output has arrived by ``deadline`` (the loop's clock)."""
        self._deadline_timer = self.loop.call_at(deadline, self._expire)

    # -- loop side: filled by the engine ----------------------------------------

    def put(self, item: _Item) -> None:
        """Deliver one output or error; dropped once the stream is closed."""
        if self._is_closed:
            return
        if isinstance(item, ConveyorError):
            self._queue.put_nowait(item)
            self.close()
            return
        if self._num_outputs == 0:
            self._cancel_deadline()
        self._num_outputs += 1
        if item.is_finished:
            self._num_open -= 1
        self._queue.put_nowait(item)

    def _expire(self) -> None:
        """The deadline passed before the first token."""
        self._deadline_timer = None
        if self._num_outputs == 0 and not self._is_closed:
            self.put(DeadlineExceeded("the request waited past its deadline for its first token"))

    def _cancel_deadline(self) -> None:
        """The first token arrived (or the stream closed): the deadline no longer applies."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    # -- caller side ------------------------------------------------------------

    def close(self) -> None:
        """Stop listening; abort the engine requests that are still running."""
        if self._is_closed:
            return
        self._is_closed = True
        self._cancel_deadline()
        if self._num_open > 0 and self._on_abort is not None:
            self._on_abort()

    async def get(self) -> GenerationOutput | None:
        """The next output; None after the last one; raises the error a request met."""
        if self._queue.empty() and (self.is_finished or self._is_closed):
            return None
        item = await self._queue.get()
        if isinstance(item, ConveyorError):
            raise item
        return item

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> GenerationOutput:
        item = await self.get()
        if item is None:
            raise StopAsyncIteration
        return item


def deliver_threadsafe(items: Iterable[tuple[GenerationStream, _Item]]) -> None:
    """From any thread: hand each item to its stream on the stream's own loop.

    One ``call_soon_threadsafe`` per loop and batch, not per item: a step can produce
    hundreds of outputs and each wake-up of the loop costs more than the delivery.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[GenerationStream, _Item]]] = {}
    for stream, item in items:
        by_loop.setdefault(stream.loop, []).append((stream, item))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:
            # The loop is closed: nobody is left to read these outputs.
            log.debug("dropped %d outputs for a closed event loop", len(batch))


def _put_all(batch: list[tuple[GenerationStream, Any]]) -> None:
    """On the loop: deliver a batch in order."""
    for stream, item in batch:
        stream.put(item)
