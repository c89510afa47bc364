"""Notice a caller who disconnects while their inputs wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive


def cancel_current_task() -> Callable[[], None]:
    """A callback that cancels the task running now (the handler awaiting a result)."""
    task = asyncio.current_task()

    def cancel() -> None:
        if task is not None:
            task.cancel()

    return cancel


class DisconnectWatcher:
    """Runs ``on_disconnect`` if the client goes away before ``close`` is called.

    Start it only after the request body has been read, so ``receive`` yields
    nothing but the disconnect. One small task per request.
    """

    def __init__(self, receive: Receive, on_disconnect: Callable[[], None]) -> None:
        self.is_gone = False
        self._on_disconnect = on_disconnect
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.is_gone = True
        self._on_disconnect()

    def close(self) -> None:
        """Stop watching (the response is on its way)."""
        self._task.cancel()
