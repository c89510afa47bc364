"""Notice a caller who disconnects while their inputs wait: ``disconnect_cancels`` is the
one way a handler waits on work it drops when its caller leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from starlette.types import Receive, Scope

from conveyor.errors import ClientGone

# Where Conveyor's server protocol puts each request's `DisconnectHook`, in the ASGI
# scope's ``extensions``.
DISCONNECT_HOOK = "conveyor.disconnect"


def cancel_current_task() -> Callable[[], None]:
    """A callback that cancels the task running now (the handler awaiting a result)."""
    task = asyncio.current_task()

    def cancel() -> None:
        if task is not None:
            task.cancel()

    return cancel


class DisconnectHook:
    """One request's line to its connection: the server protocol fires it when the
    connection is lost, and calls back whoever watches at that moment."""

    __slots__ = ("_callback", "is_fired")

    def __init__(self) -> None:
        self._callback: Callable[[], None] | None = None
        self.is_fired = False

    def watch(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` when the connection is lost (None: stop watching)."""
        self._callback = callback

    def fire(self) -> None:
        """The connection is lost: call the watcher back, once."""
        if self.is_fired:
            return
        self.is_fired = True
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


class DisconnectWatcher:
    """Runs ``on_disconnect`` if the client goes away before ``close`` is called.

    Start it only after the request body has been read. Under Conveyor's server protocol
    it watches the request's `DisconnectHook` (no task); elsewhere (another server, an
    in-process test client) one small task waits for ``receive`` to say the client left.
    """

    def __init__(
        self, receive: Receive, on_disconnect: Callable[[], None], scope: Scope | None = None
    ) -> None:
        self.is_gone = False
        self._on_disconnect = on_disconnect
        self._task: asyncio.Task[None] | None = None
        self._hook = _hook_of(scope)
        if self._hook is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(receive))
        elif self._hook.is_fired:
            self._gone()
        else:
            self._hook.watch(self._gone)

    def _gone(self) -> None:
        self.is_gone = True
        self._on_disconnect()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone()

    def close(self) -> None:
        """Stop watching (the response is on its way)."""
        if self._hook is not None:
            self._hook.watch(None)
        if self._task is not None:
            self._task.cancel()


@contextmanager
def disconnect_cancels(receive: Receive, scope: Scope) -> Iterator[None]:
    """Run the block cancelled if the client goes away meanwhile, which then raises
    ``ClientGone`` instead of the cancellation (any other cancellation goes on as it came).

    Enter it only after the request body has been read (``DisconnectWatcher``).
    """
    watcher = DisconnectWatcher(receive, cancel_current_task(), scope)
    try:
        yield
    except asyncio.CancelledError:
        if not watcher.is_gone:
            raise
        raise ClientGone("the client disconnected before the result was ready") from None
    finally:
        watcher.close()


def _hook_of(scope: Scope | None) -> DisconnectHook | None:
    if scope is None:
        return None
    hook = scope.get("extensions", {}).get(DISCONNECT_HOOK)
    return hook if isinstance(hook, DisconnectHook) else None
