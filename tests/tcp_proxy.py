"""A TCP proxy a test controls, for cutting a service off from its clients on purpose.

Modes:
- `PASS`: bytes flow both ways;
- `REFUSE`: every open connection is cut and new ones are closed as soon as they arrive,
  like a server that is down;
- `FREEZE`: connections are accepted but no byte is forwarded either way, like a server or
  network that drops packets; bytes read meanwhile are held and flow on if the proxy passes
  again.

The proxy runs its own event loop in a thread, so blocking test code and servers in other
processes can use it alike. `set_mode` returns once the new mode is in force.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from types import TracebackType

READ_BYTES = 64 * 1024
CALL_TIMEOUT_S = 10.0


class ProxyMode(enum.Enum):
    """What the proxy does with connections."""

    PASS = "pass"
    REFUSE = "refuse"
    FREEZE = "freeze"


class TcpProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to `upstream_host:upstream_port`."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        """Prepare the proxy; `start` (or `with`) opens the port."""
        self._upstream = (upstream_host, upstream_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy")
        self._server: asyncio.Server | None = None
        self._mode = ProxyMode.PASS
        self._thawed: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0
        self.num_accepted = 0

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def mode(self) -> ProxyMode:
        """The mode in force."""
        return self._mode

    def start(self) -> None:
        """Start the loop thread and listen."""
        self._thread.start()
        self._call(self._listen())

    def set_mode(self, mode: ProxyMode) -> None:
        """Switch modes; returns once connections follow the new mode."""
        self._call(self._apply(mode))

    def close(self) -> None:
        """Cut every connection, stop listening and stop the thread."""
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self._loop.close()

    def _call(self, coro: object) -> None:
        """Run a coroutine on the proxy's loop and wait for it."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        future.result(CALL_TIMEOUT_S)

    async def _listen(self) -> None:
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _apply(self, mode: ProxyMode) -> None:
        assert self._thawed is not None
        self._mode = mode
        if mode is ProxyMode.REFUSE:
            self._cut_all()
        if mode is ProxyMode.FREEZE:
            self._thawed.clear()
        else:
            self._thawed.set()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._apply(ProxyMode.REFUSE)  # held connections end, open ones are cut
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=CALL_TIMEOUT_S / 2)

    def _cut_all(self) -> None:
        """Abort every open connection, both sides."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: held while frozen, closed when refusing, else forwarded."""
        assert self._thawed is not None
        self.num_accepted += 1
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)
        self._writers.add(writer)
        await self._thawed.wait()
        if self._mode is ProxyMode.REFUSE or writer.transport.is_closing():
            writer.transport.abort()
            self._writers.discard(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        for end in (writer, up_writer):
            end.transport.abort()
            self._writers.discard(end)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy bytes until either side closes; hold them while frozen."""
        assert self._thawed is not None
        try:
            while data := await source.read(READ_BYTES):
                await self._thawed.wait()
                if sink.transport.is_closing():
                    break
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.transport.abort()
