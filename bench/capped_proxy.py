"""A TCP proxy on 127.0.0.1 that caps, in total, the bytes its upstream sends back.

Stands for an origin's bandwidth: every byte the upstream server answers with, on every
connection together, goes through one `BytePacer`; requests go upstream uncapped. It counts
the bytes it relayed back, which is what the origin served (payload plus HTTP framing).
Runs its own event loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import threading

from conveyor.distribution.pacer import BytePacer

LOCALHOST = "127.0.0.1"
READ_BYTES = 64 * 1024


class CappedProxy:
    """Relay 127.0.0.1:`port` to 127.0.0.1:`upstream_port`, answers capped at `rate_bytes_s`."""

    def __init__(self, upstream_port: int, rate_bytes_s: float) -> None:
        """Configure; `start` opens the listener."""
        self.upstream_port = upstream_port
        self.pacer = BytePacer(rate_bytes_s, burst_bytes=READ_BYTES)
        self.served_bytes = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> int:
        """Open the listener on a free port and return it."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self.port

    def stop(self) -> None:
        """Close the listener and stop the loop."""
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._relay, LOCALHOST, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(LOCALHOST, self.upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            self._pipe(client_r, up_w, is_answer=False),
            self._pipe(up_r, client_w, is_answer=True),
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, is_answer: bool
    ) -> None:
        """Copy until EOF or a reset; pace and count the upstream's answers."""
        try:
            while data := await reader.read(READ_BYTES):
                if is_answer:
                    delay_s = self.pacer.reserve(len(data))
                    if delay_s > 0:
                        await asyncio.sleep(delay_s)
                    self.served_bytes += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
