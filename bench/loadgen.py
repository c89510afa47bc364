"""A cheap HTTP/1.1 load generator, run as its own process so it never shares the
server's event loop.

Open loop: requests go out on a fixed schedule (constant rate) and latency counts
from each request's *intended* send time, so a slow server cannot hide its queueing
behind a slowed-down client. Closed loop: N connections, each sending its next request
as soon as the previous answer arrives (for saturation throughput).

Cheap per request: raw asyncio protocols on keep-alive connections, request bytes
encoded once up front, responses framed by Content-Length only. If no connection is
free at a send time another is opened (up to a bound) and the request waits for the
first free one; the schedule itself never slips.

    python -m bench.loadgen --port 8000 --bodies bodies.json --mode open --rate 500 \
        --seconds 3

prints one JSON object (a ``LoadResult``) on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import math
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from bench.common import LOCALHOST, REPO_ROOT, child_env

# Timestamps come from the monotonic clock, not loop.time(): uvloop's loop time is
# cached per loop iteration with millisecond resolution, too coarse for latencies.
_now = time.monotonic

MIN_SLEEP_S = 0.001
STATUS_LOST = 0  # the connection closed before the answer was complete
STATUS_UNFINISHED = -1  # still waiting when the drain time ran out


class LoadMode(enum.Enum):
    """How requests are paced."""

    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One load run: its pacing, its length and its connection bounds."""

    mode: LoadMode
    seconds: float
    rate_per_s: float = 0.0
    num_clients: int = 0
    expected_latency_ms: float = 50.0
    max_connections: int = 1024
    ramp_s: float = 0.0
    drain_s: float = 2.0
    path: str = "/v1/embeddings"

    def __post_init__(self) -> None:
        if self.seconds <= 0 or self.drain_s < 0 or self.expected_latency_ms <= 0:
            raise ValueError("seconds and expected_latency_ms must be > 0, drain_s >= 0")
        if not 0 <= self.ramp_s < self.seconds:
            raise ValueError("ramp_s must be in [0, seconds)")
        if self.mode is LoadMode.OPEN and self.rate_per_s <= 0:
            raise ValueError("an open-loop run needs rate_per_s > 0")
        if self.mode is LoadMode.CLOSED and self.num_clients < 1:
            raise ValueError("a closed-loop run needs num_clients >= 1")
        if self.max_connections < max(1, self.num_clients):
            raise ValueError("max_connections must cover num_clients")

    @property
    def initial_connections(self) -> int:
        """Connections opened before the clock starts: rate x expected latency, with room."""
        if self.mode is LoadMode.CLOSED:
            return self.num_clients
        wanted = math.ceil(self.rate_per_s * self.expected_latency_ms / 1000 * 1.5) + 2
        return min(self.max_connections, wanted)

    def to_argv(self) -> list[str]:
        """The command-line options that reproduce this spec."""
        return [
            f"--mode={self.mode.value}",
            f"--seconds={self.seconds}",
            f"--rate={self.rate_per_s}",
            f"--clients={self.num_clients}",
            f"--expected-latency-ms={self.expected_latency_ms}",
            f"--max-connections={self.max_connections}",
            f"--ramp-s={self.ramp_s}",
            f"--drain-s={self.drain_s}",
            f"--path={self.path}",
        ]


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one run measured. Latencies are in ms; counted requests are those whose
    intended send time lies in the window [ramp_s, seconds)."""

    mode: str
    offered_per_s: float | None
    num_clients: int | None
    window_s: float
    throughput_per_s: float
    num_sent: int
    num_ok: int
    num_errors: int
    num_unfinished: int
    errors_by_status: dict[str, int]
    num_latency_samples: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None
    schedule_lag_p99_ms: float | None
    schedule_lag_max_ms: float | None
    peak_connections: int
    num_connect_errors: int
    loadgen_cpu_pct: float
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadResult:
        """Inverse of ``to_dict``."""
        return cls(**data)


def encode_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """A complete HTTP/1.1 POST, keep-alive, with a JSON body."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def content_length(buffer: bytearray, header_end: int) -> int:
    """The Content-Length value, or -1 when the response has none."""
    start = buffer.find(b"content-length:", 0, header_end)
    if start < 0:  # servers may capitalise it; look again the slow way
        start = bytes(buffer[:header_end]).lower().find(b"content-length:")
        if start < 0:
            return -1
    end = buffer.find(b"\r\n", start, header_end + 2)
    return int(buffer[start + len(b"content-length:") : end])


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, client: _Client) -> None:
        self._client = client
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._need = -1  # bytes of the whole response, once its head is parsed
        self._status = 0
        self.intended_at = 0.0
        self.is_busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Ready: join the pool."""
        # uvloop's TCP transports quack like asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._client.on_connected(self)

    def send(self, request: bytes, intended_at: float) -> None:
        """Write one request; ``intended_at`` is when the schedule wanted it sent."""
        self.intended_at = intended_at
        self.is_busy = True
        if self._transport is not None:
            self._transport.write(request)

    def data_received(self, data: bytes) -> None:
        """Frame the response by Content-Length; hand it back when complete."""
        buffer = self._buffer
        buffer += data
        if self._need < 0:
            header_end = buffer.find(b"\r\n\r\n")
            if header_end < 0:
                return
            self._status = int(buffer[9:12])
            length = content_length(buffer, header_end)
            if length < 0:  # unframed answer (chunked): we cannot reuse this connection
                self._status = STATUS_LOST
                self.close()
                return
            self._need = header_end + 4 + length
        if len(buffer) >= self._need:
            del buffer[: self._need]
            self._need = -1
            self.is_busy = False
            self._client.on_response(self, self._status)

    def connection_lost(self, exc: Exception | None) -> None:
        """Closed by either side: leave the pool (a request in flight is an error)."""
        self._client.on_lost(self)

    def close(self) -> None:
        """Close the socket."""
        if self._transport is not None:
            self._transport.close()


@dataclass(slots=True)
class _Tally:
    """Raw per-request observations, summarised after the run."""

    records: list[tuple[float, float, int]] = field(default_factory=list)
    schedule_lags_s: list[float] = field(default_factory=list)
    num_dispatched: int = 0
    num_connect_errors: int = 0
    peak_connections: int = 0


class _Client:
    """The connection pool, the backlog of requests waiting for a connection, and the
    records of every answer."""

    def __init__(
        self, host: str, port: int, requests: Sequence[bytes], max_connections: int
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._host = host
        self._port = port
        self._requests = requests
        self._max_connections = max_connections
        self._next_request = 0
        self.idle: list[_Connection] = []
        self.connections: set[_Connection] = set()
        self.backlog: deque[float] = deque()
        self.num_connecting = 0
        self.closed_loop_until: float | None = None
        self.tally = _Tally()
        self._is_sending_done = False
        self._drained = asyncio.Event()

    @property
    def num_pending(self) -> int:
        """Requests dispatched and not yet answered (or lost)."""
        return self.tally.num_dispatched - len(self.tally.records)

    async def wait_drained(self, timeout_s: float) -> None:
        """After the last send: wait until every request is answered, or ``timeout_s``."""
        self._is_sending_done = True
        self._check_drained()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), max(0.0, timeout_s))

    def _check_drained(self) -> None:
        if self._is_sending_done and self.num_pending <= 0:
            self._drained.set()

    async def open(self, count: int) -> None:
        """Open ``count`` connections and wait until they are all up."""
        await asyncio.gather(*(self._connect() for _ in range(count)))

    async def _connect(self) -> None:
        self.num_connecting += 1
        try:
            await self._loop.create_connection(lambda: _Connection(self), self._host, self._port)
        except OSError:
            self.tally.num_connect_errors += 1
        finally:
            self.num_connecting -= 1

    def dispatch(self, intended_at: float) -> None:
        """Send now on a free connection, or queue for the next free one (and open one)."""
        self.tally.num_dispatched += 1
        if self.idle:
            self._send(self.idle.pop(), intended_at)
            return
        self.backlog.append(intended_at)
        num_open = len(self.connections) + self.num_connecting
        if num_open < self._max_connections and self.num_connecting < len(self.backlog):
            self._loop.create_task(self._connect())

    def _send(self, conn: _Connection, intended_at: float) -> None:
        request = self._requests[self._next_request]
        self._next_request = (self._next_request + 1) % len(self._requests)
        conn.send(request, intended_at)

    def _next_work(self, conn: _Connection) -> None:
        if self.backlog:
            self._send(conn, self.backlog.popleft())
            return
        until = self.closed_loop_until
        if until is not None and (now := _now()) < until:
            self.tally.num_dispatched += 1
            self._send(conn, now)
            return
        self.idle.append(conn)

    def start_closed_loop(self, until: float) -> None:
        """Send on every idle connection; each answer triggers the next send until ``until``."""
        self.closed_loop_until = until
        idle, self.idle = self.idle, []
        for conn in idle:
            self.tally.num_dispatched += 1
            self._send(conn, _now())

    def on_connected(self, conn: _Connection) -> None:
        """A new connection is up."""
        self.connections.add(conn)
        self.tally.peak_connections = max(self.tally.peak_connections, len(self.connections))
        self._next_work(conn)

    def on_response(self, conn: _Connection, status: int) -> None:
        """An answer is complete: record it and give the connection its next job."""
        self.tally.records.append((conn.intended_at, _now(), status))
        self._next_work(conn)
        self._check_drained()

    def on_lost(self, conn: _Connection) -> None:
        """A connection closed: count its request as lost, forget the connection."""
        self.connections.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.is_busy:
            conn.is_busy = False
            self.tally.records.append((conn.intended_at, _now(), STATUS_LOST))
            self._check_drained()

    def unfinished(self) -> list[float]:
        """Intended send times of requests still in flight or still waiting."""
        busy = [conn.intended_at for conn in self.connections if conn.is_busy]
        return busy + list(self.backlog)

    def close_all(self) -> None:
        """Close every connection (the server then drops what it still holds for us)."""
        for conn in list(self.connections):
            conn.is_busy = False
            conn.close()


async def _send_on_schedule(client: _Client, spec: LoadSpec, t0: float) -> None:
    """Open loop: request i is due at t0 + i / rate; late wake-ups send all that are due."""
    interval_s = 1.0 / spec.rate_per_s
    total = max(1, round(spec.rate_per_s * spec.seconds))
    lags = client.tally.schedule_lags_s
    num_sent = 0
    while num_sent < total:
        now = _now()
        due = t0 + num_sent * interval_s
        while num_sent < total and due <= now:
            client.dispatch(due)
            lags.append(now - due)
            num_sent += 1
            due = t0 + num_sent * interval_s
        if num_sent < total:
            # Event-loop timers tick in whole milliseconds; a shorter sleep returns at
            # once and the loop would spin a core the server needs.
            await asyncio.sleep(max(MIN_SLEEP_S, due - _now()))


async def _send_closed_loop(client: _Client, spec: LoadSpec, t0: float) -> None:
    """Closed loop: every connection sends, then sends again on each answer, until the end."""
    await asyncio.sleep(max(0.0, t0 - _now()))
    client.start_closed_loop(t0 + spec.seconds)
    await asyncio.sleep(max(0.0, t0 + spec.seconds - _now()))


async def run_load(spec: LoadSpec, host: str, port: int, requests: Sequence[bytes]) -> LoadResult:
    """Run one load (in this process's event loop) and summarise it."""
    if not requests:
        raise ValueError("at least one request body is needed")
    client = _Client(host, port, requests, spec.max_connections)
    await client.open(spec.initial_connections)
    if not client.connections:
        raise ConnectionError(f"cannot connect to {host}:{port}")
    cpu_started = time.process_time()
    wall_started = time.monotonic()
    t0 = _now() + 0.005
    if spec.mode is LoadMode.OPEN:
        await _send_on_schedule(client, spec, t0)
    else:
        await _send_closed_loop(client, spec, t0)
    await client.wait_drained(t0 + spec.seconds + spec.drain_s - _now())
    stopped_at = _now()
    unfinished = client.unfinished()
    client.close_all()
    wall_s = time.monotonic() - wall_started
    cpu_pct = 100.0 * (time.process_time() - cpu_started) / max(wall_s, 1e-9)
    return summarize(
        spec,
        client.tally,
        unfinished,
        t0=t0,
        stopped_at=stopped_at,
        loadgen_cpu_pct=cpu_pct,
        wall_s=wall_s,
    )


def percentile(sorted_values: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(share * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else round(value_s * 1000, 3)


def summarize(
    spec: LoadSpec,
    tally: _Tally,
    unfinished: list[float],
    *,
    t0: float,
    stopped_at: float,
    loadgen_cpu_pct: float,
    wall_s: float,
) -> LoadResult:
    """Throughput and latency percentiles over the counted window.

    Requests still unanswered at the end count with the time they had waited so far
    (a lower bound), so an overloaded server's backlog shows in the tail.
    """
    start, end = t0 + spec.ramp_s, t0 + spec.seconds
    window_s = end - start
    latencies: list[float] = []
    errors: dict[str, int] = {}
    num_ok_in_window = 0
    for intended, done, status in tally.records:
        if status != 200:
            key = "lost" if status == STATUS_LOST else str(status)
            errors[key] = errors.get(key, 0) + 1
            continue
        num_ok_in_window += start <= done < end
        if start <= intended < end:
            latencies.append(done - intended)
    latencies.extend(stopped_at - t for t in unfinished if start <= t < end)
    latencies.sort()
    lags = sorted(tally.schedule_lags_s)
    num_ok = len(tally.records) - sum(errors.values())
    return LoadResult(
        mode=spec.mode.value,
        offered_per_s=spec.rate_per_s if spec.mode is LoadMode.OPEN else None,
        num_clients=spec.num_clients if spec.mode is LoadMode.CLOSED else None,
        window_s=round(window_s, 3),
        throughput_per_s=round(num_ok_in_window / window_s, 2),
        num_sent=tally.num_dispatched,
        num_ok=num_ok,
        num_errors=sum(errors.values()),
        num_unfinished=len(unfinished),
        errors_by_status=errors,
        num_latency_samples=len(latencies),
        p50_ms=_ms(percentile(latencies, 0.50)),
        p90_ms=_ms(percentile(latencies, 0.90)),
        p99_ms=_ms(percentile(latencies, 0.99)),
        max_ms=_ms(latencies[-1] if latencies else None),
        mean_ms=_ms(sum(latencies) / len(latencies) if latencies else None),
        schedule_lag_p99_ms=_ms(percentile(lags, 0.99)),
        schedule_lag_max_ms=_ms(lags[-1] if lags else None),
        peak_connections=tally.peak_connections,
        num_connect_errors=tally.num_connect_errors,
        loadgen_cpu_pct=round(loadgen_cpu_pct, 1),
        wall_s=round(wall_s, 3),
    )


def run_load_process(
    spec: LoadSpec, port: int, bodies_path: Path, *, host: str = LOCALHOST
) -> LoadResult:
    """Run one load in a separate load-generator process and return its result."""
    argv = [
        sys.executable, "-m", "bench.loadgen", f"--host={host}", f"--port={port}",
        f"--bodies={bodies_path}", *spec.to_argv(),
    ]  # fmt: skip
    timeout_s = spec.seconds + spec.drain_s + 60
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout_s,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return LoadResult.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default=LOCALHOST)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bodies", type=Path, required=True, help="JSON list of body strings")
    parser.add_argument("--mode", choices=[mode.value for mode in LoadMode], default="open")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=0.0, help="open loop: requests/s")
    parser.add_argument("--clients", type=int, default=0, help="closed loop: connections")
    parser.add_argument("--expected-latency-ms", type=float, default=50.0)
    parser.add_argument("--max-connections", type=int, default=1024)
    parser.add_argument("--ramp-s", type=float, default=0.0)
    parser.add_argument("--drain-s", type=float, default=2.0)
    parser.add_argument("--path", default="/v1/embeddings")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: run one load, print its ``LoadResult`` as JSON."""
    args = _parse_args(argv)
    if args.host != LOCALHOST:
        raise SystemExit("the load generator only targets 127.0.0.1")
    spec = LoadSpec(
        mode=LoadMode(args.mode), seconds=args.seconds, rate_per_s=args.rate,
        num_clients=args.clients, expected_latency_ms=args.expected_latency_ms,
        max_connections=args.max_connections, ramp_s=args.ramp_s, drain_s=args.drain_s,
        path=args.path,
    )  # fmt: skip
    bodies = json.loads(args.bodies.read_text())
    requests = [encode_request(args.host, args.port, spec.path, b.encode()) for b in bodies]
    result = _run_with_fast_loop(spec, args.host, args.port, requests)
    sys.stdout.write(json.dumps(result.to_dict()) + "\n")


def _run_with_fast_loop(spec: LoadSpec, host: str, port: int, requests: list[bytes]) -> LoadResult:
    try:
        import uvloop
    except ImportError:  # plain asyncio still works, at a higher cost per request
        return asyncio.run(run_load(spec, host, port, requests))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_load(spec, host, port, requests))


if __name__ == "__main__":
    main()
