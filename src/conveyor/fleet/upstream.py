"""A lean pooled HTTP/1.1 client for the gateway's trips to workers.

Built the way reverse proxies keep an upstream hop cheap (nginx's upstream ``keepalive``,
Envoy's HTTP/1 connection pool): one asyncio protocol per keep-alive connection, httptools'
C parser for the answers, the request head and body handed to the socket in one write,
idle connections reused newest first, and a deadline that is one timer on the event loop.
There are no per-request layers (auth flows, redirects, cookies, URL objects) to pay for.

A response's body is read whole (``read``) or relayed chunk by chunk (``chunks``); a
relayed stream stops reading from the worker while the client falls behind.

A connection (``fleet.upstream_connection``) carries exactly one answer per request; one
out of step is closed rather than pooled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from conveyor.fleet.upstream_connection import (
    ConnectFailed,
    Connection,
    ConnectionBroken,
    Origin,
    UpstreamTimeout,
    encode_head,
    parse_origin,
)


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """How many connections, how many kept idle per worker, and for how long."""

    max_connections: int = 256
    max_idle_per_worker: int = 64
    # Shorter than the workers' keep-alive, so a reused socket is never one the worker is
    # closing (that would look like a reset and eject a healthy worker).
    idle_expiry_s: float = 4.0
    connect_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        """Validate the limits."""
        if self.max_connections < 1 or self.max_idle_per_worker < 0:
            raise ValueError("max_connections must be >= 1 and max_idle_per_worker >= 0")
        if self.idle_expiry_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("idle_expiry_s and connect_timeout_s must be > 0")


class UpstreamResponse:
    """A worker's answer: status and headers now, the body by ``read`` or ``chunks``.

    Call ``release`` exactly when done with it (``read`` does so itself): the connection
    goes back to the pool if the answer was complete, and is closed otherwise.
    """

    def __init__(self, pool: UpstreamPool, connection: Connection) -> None:
        self._pool = pool
        self._connection = connection
        self.status = connection.status
        self.headers = connection.headers
        self._is_released = False

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The whole body, within the exchange's deadline; then releases the connection."""
        connection = self._connection
        try:
            while not connection.is_complete:
                await connection.wait()
            return b"".join(connection.take_chunks())
        finally:
            self.release()

    async def chunks(self, idle_timeout_s: float) -> AsyncIterator[bytes]:
        """The body as it arrives; fails if the worker is silent for ``idle_timeout_s``."""
        connection = self._connection
        loop = asyncio.get_running_loop()
        while True:
            connection.arm_timer(loop.time() + idle_timeout_s)
            while not connection.chunks and not connection.is_complete:
                await connection.wait()
            for chunk in connection.take_chunks():
                yield chunk
            if connection.is_complete:
                return

    def release(self) -> None:
        """Give the connection back (complete answer) or close it (anything else)."""
        if not self._is_released:
            self._is_released = True
            self._pool.give_back(self._connection)


class UpstreamPool:
    """Keep-alive connections to workers, at most ``max_connections`` in use at once."""

    def __init__(
        self, limits: PoolLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or PoolLimits()
        self._origins: dict[str, Origin] = {}
        self._idle: dict[Origin, list[Connection]] = {}
        self._slots = asyncio.Semaphore(self.limits.max_connections)
        self._clock = clock

    def num_idle(self, address: str) -> int:
        """Idle connections kept for ``address``."""
        origin = self._origins.get(address)
        return len(self._idle.get(origin, ())) if origin else 0

    async def request(
        self,
        address: str,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        deadline: float,
    ) -> UpstreamResponse:
        """Send one request to the worker at ``address``; return once its headers are in.

        ``deadline`` (event-loop time) bounds the whole answer; the connect alone is also
        bounded by ``connect_timeout_s``. Raises ``ConnectFailed``, ``ConnectionBroken`` or
        ``UpstreamTimeout``.
        """
        origin = self._origins.get(address)
        if origin is None:
            origin = self._origins[address] = parse_origin(address)
        request = encode_head(method, target, origin, headers, len(body)) + body
        await self._take_slot(deadline)
        connection: Connection | None = None
        try:
            connection = self._idle_connection(origin)
            if connection is not None:
                try:
                    await self._exchange(connection, request, deadline)
                    return UpstreamResponse(self, connection)
                except ConnectionBroken:
                    if connection.has_received:
                        raise
                    # Closed with no byte answered: most likely the worker ended the idle
                    # connection as it was reused (its keep-alive ran out, or its connection
                    # budget made way). As HTTP clients do, once more on a fresh connection.
            connection = await self._new_connection(origin, deadline)
            await self._exchange(connection, request, deadline)
        except BaseException:  # cancelled too: the slot and the socket must not leak
            self._slots.release()
            if connection is not None:
                connection.fail(ConnectionBroken("the exchange was abandoned"))
            raise
        return UpstreamResponse(self, connection)

    @staticmethod
    async def _exchange(connection: Connection, request: bytes, deadline: float) -> None:
        """Send ``request`` and wait for the answer's status line and headers."""
        connection.start(request, deadline)
        while not connection.has_headers:
            await connection.wait()

    async def _take_slot(self, deadline: float) -> None:
        if not self._slots.locked():
            await self._slots.acquire()
            return
        remaining_s = deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(self._slots.acquire(), max(0.0, remaining_s))
        except TimeoutError:
            raise UpstreamTimeout("no connection to a worker came free in time") from None

    def _idle_connection(self, origin: Origin) -> Connection | None:
        """The newest idle connection to ``origin`` still open and not expired, if any."""
        idle = self._idle.get(origin)
        now = self._clock()
        while idle:
            connection = idle.pop()
            if connection.is_usable and now - connection.idle_since < self.limits.idle_expiry_s:
                return connection
            connection.close()
        return None

    async def _new_connection(self, origin: Origin, deadline: float) -> Connection:
        """A new connection, within ``connect_timeout_s`` and the deadline."""
        loop = asyncio.get_running_loop()
        timeout_s = min(self.limits.connect_timeout_s, max(0.0, deadline - loop.time()))
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(origin), origin.host, origin.port),
                timeout_s,
            )
        except TimeoutError:
            raise ConnectFailed(f"connecting to {origin.host}:{origin.port} timed out") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {exc}") from None
        return connection

    def give_back(self, connection: Connection) -> None:
        """End an exchange: keep the connection idle if it can carry another."""
        self._slots.release()
        connection.end_exchange()
        idle = self._idle.setdefault(connection.origin, [])
        if connection.can_keep_alive() and len(idle) < self.limits.max_idle_per_worker:
            connection.idle_since = self._clock()
            idle.append(connection)
        else:
            connection.fail(ConnectionBroken("released before the answer was complete"))

    def close(self) -> None:
        """Close every idle connection (those in use close when released)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
