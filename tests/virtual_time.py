"""An asyncio loop on a virtual clock: when nothing is ready, the clock jumps to the next
timer instead of waiting for it, so a test of timed code runs at once and measures
exactly what the code slept, whatever else the machine is doing."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that never blocks: a wait of `timeout` moves the loop's clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            # No timer: the loop waits for I/O or for another thread (whose results come
            # through the loop's self-pipe). Block as a real loop does: spinning here would
            # hold the GIL against that very thread, and under load a test then timed out.
            return super().select(None)
        if timeout > 0:
            self._loop.advance(timeout)
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector loop whose `time()` is virtual and moves only by waiting."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self._virtual_now += seconds


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
