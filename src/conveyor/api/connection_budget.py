"""The places under ``max_connections``, and which connection gives its place up first.

A connection is *busy* from the moment it has sent a whole request head until that
request is answered, and *waiting* the rest of the time: just connected, still sending
a head, or idle between requests. Only busy connections can fill the budget: a request
that finds ``capacity`` busy connections is refused (503). Waiting ones make way
instead: a new connection that finds every place taken takes the place of the
connection that has waited longest, as nginx reuses its idle keep-alive connections
when it runs out. So connections that never complete a request (a slow-loris, a
request trickled without an API key) cannot keep anyone else out, however many there
are; a connection that has sent its head gets an answer quickly (a 401 without a key),
and one answered before its body was read is closed.

Pure bookkeeping: the server protocol closes the connections it is told to.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


class ConnectionBudget(Generic[C]):
    """``capacity`` places shared by busy and waiting connections (see the module)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        # Oldest first: the order in which waiting connections make way.
        self._waiting: OrderedDict[C, None] = OrderedDict()
        self._busy: set[C] = set()

    @property
    def num_busy(self) -> int:
        """Connections with a request in progress."""
        return len(self._busy)

    @property
    def num_waiting(self) -> int:
        """Connections without one."""
        return len(self._waiting)

    def open(self, connection: C) -> C | None:
        """A new connection waits for its first request; returns the connection to close
        for it (the longest waiting) when every place is taken, else None."""
        evicted = None
        if self._waiting and len(self._waiting) + len(self._busy) >= self.capacity:
            evicted, _ = self._waiting.popitem(last=False)
        self._waiting[connection] = None
        return evicted

    def start(self, connection: C) -> bool:
        """The connection has sent a request head: busy if a place is free (True), else
        the request is to be refused (False). A busy connection (pipelining) stays so."""
        if connection in self._busy:
            return True
        if len(self._busy) >= self.capacity:
            return False
        self._waiting.pop(connection, None)
        self._busy.add(connection)
        return True

    def wait(self, connection: C) -> None:
        """The connection's request is answered: it waits again, as the newest."""
        self._busy.discard(connection)
        self._waiting.pop(connection, None)
        self._waiting[connection] = None

    def close(self, connection: C) -> None:
        """The connection holds no place any more (closed, or closing)."""
        self._busy.discard(connection)
        self._waiting.pop(connection, None)
