"""Every answer through a gateway belongs to its own request, whatever the connections do.

A real gateway process in front of a real worker (the synthetic model) and a flaky scripted
worker, on a fresh PostgreSQL store. Two tenants send embeddings at once over raw sockets:
with ``Expect: 100-continue`` (as curl does for bodies of 1 MiB or more), pipelined three to
a connection, or abandoned right after sending. The flaky worker sends interim answers,
cuts some answers mid-body and follows some with a stray second answer. Request ``i``
carries ``i + 1`` words, and both workers answer with that count in ``usage``, so an answer
handed to the wrong request cannot go unnoticed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest

from conveyor.stores import open_job_store
from tests.integration.fleet.conftest import MODEL, SYNTHETIC, Fleet, Proc
from tests.integration.fleet.test_tenant_limits import create_key

pytestmark = pytest.mark.postgres

NUM_REQUESTS = 150
CONCURRENCY = 24
CLIENT_TIMEOUT_S = 20.0


def answer_for(num_words: int) -> bytes:
    """An embeddings answer whose usage names the request it answers."""
    return orjson.dumps(
        {"object": "list", "model": MODEL, "data": [{"object": "embedding", "index": 0,
         "embedding": [float(num_words)]}],
         "usage": {"prompt_tokens": num_words, "total_tokens": num_words}}
    )  # fmt: skip


def http_answer(body: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


class FlakyWorker:
    """A worker that answers correctly, but with every misbehaviour a proxy must survive.

    By the order requests reach it: interim ``100`` and ``103`` answers before the real one
    (every third), the answer cut short and the connection closed (every fifth), a stray
    answer for another request right after the real one (every fourth).
    """

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shut_down(self) -> None:
        """Close the server and end every connection's task while the loop still runs."""
        assert self._server is not None
        self._server.close()
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        start = asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._server = self._loop.run_until_complete(start)
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._answer_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        if b"\r\nexpect:" in head.lower():
            self.seen["expect_forwarded"] += 1
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = orjson.loads(await reader.readexactly(length))
        num_words = len(body["input"][0].split())
        answer = http_answer(answer_for(num_words))
        turn = sum(self.seen.values())
        if turn % 3 == 0:
            self.seen["interim"] += 1
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n")
        if turn % 5 == 1:
            self.seen["cut"] += 1
            writer.write(answer[: len(answer) - 10])
            await writer.drain()
            return False
        if turn % 4 == 2:
            self.seen["stray"] += 1
            answer += http_answer(answer_for(num_words + 1000))
        self.seen["answered"] += 1
        writer.write(answer)
        await writer.drain()
        return True


def heartbeat(store_url: str, worker: FlakyWorker, stop: threading.Event) -> None:
    """Keep the flaky worker registered, as a real worker's heartbeats would."""
    store = open_job_store(store_url)
    try:
        while not stop.is_set():
            store.upsert_worker(
                "flaky", f"http://127.0.0.1:{worker.port}", [MODEL], 64, {}, time.time()
            )
            stop.wait(0.2)
    finally:
        store.close()


@pytest.fixture
def flaky_worker(store_url: str) -> Iterator[FlakyWorker]:
    worker = FlakyWorker()
    worker.start()
    stop = threading.Event()
    beating = threading.Thread(target=heartbeat, args=(store_url, worker, stop), daemon=True)
    beating.start()
    try:
        yield worker
    finally:
        stop.set()
        beating.join(5)
        worker.stop()


@dataclass(frozen=True)
class Outcome:
    """What one request got: the status and, for a 200, the word count its usage names."""

    expected: int
    status: int
    answered_words: int | None


def request_bytes(key: str, num_words: int, *, expect: bool) -> tuple[bytes, bytes]:
    """The head and body of an embeddings request of `num_words` words."""
    body = orjson.dumps({"model": MODEL, "input": [" ".join(["w"] * num_words)]})
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"x-conveyor-timeout-ms: 10000\r\n" + ("expect: 100-continue\r\n" if expect else "")
    ).encode() + b"\r\n"
    return head, body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One final answer (status, body); the client side of a 1xx is skipped as curl does."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if 100 <= status < 200:
            continue
        lowered = head.lower()
        length = int(lowered.split(b"content-length: ")[1].split(b"\r\n")[0])
        return status, await reader.readexactly(length)


def outcome(expected: int, status: int, body: bytes) -> Outcome:
    words = json.loads(body)["usage"]["prompt_tokens"] if status == 200 else None
    return Outcome(expected, status, words)


async def with_expect(port: int, key: str, num_words: int) -> list[Outcome]:
    """The head alone, then the body once the gateway says ``100 Continue``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head, body = request_bytes(key, num_words, expect=True)
        writer.write(head)
        interim = await reader.readuntil(b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100"), interim
        writer.write(body)
        status, answer = await read_answer(reader)
        return [outcome(num_words, status, answer)]
    finally:
        writer.close()


async def pipelined(port: int, key: str, first_words: int) -> list[Outcome]:
    """Three requests written at once on one connection; answers read in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        counts = [first_words, first_words + 1, first_words + 2]
        writer.write(b"".join(b"".join(request_bytes(key, n, expect=False)) for n in counts))
        return [outcome(n, *await read_answer(reader)) for n in counts]
    finally:
        writer.close()


async def abandoned(port: int, key: str, num_words: int) -> list[Outcome]:
    """The whole request, then gone before any answer: the gateway must drop its trip."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(request_bytes(key, num_words, expect=False)))
    await writer.drain()
    writer.close()
    return []


async def drive(gateway: Proc, keys: list[str]) -> list[Outcome]:
    """`NUM_REQUESTS` clients of the kinds above, `CONCURRENCY` at a time, two tenants."""
    port = int(gateway.url.rsplit(":", 1)[1])
    gate = asyncio.Semaphore(CONCURRENCY)
    kinds = (with_expect, pipelined, with_expect, abandoned)

    async def one(i: int) -> list[Outcome]:
        async with gate:
            client = kinds[i % len(kinds)](port, keys[i % 2], 3 * i + 1)
            return await asyncio.wait_for(client, CLIENT_TIMEOUT_S)

    results = await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS)))
    return [o for outcomes in results for o in outcomes]


def test_every_answer_through_the_gateway_belongs_to_its_request(
    fleet: Fleet, store_url: str, flaky_worker: FlakyWorker
) -> None:
    keys = [create_key(store_url, "tenant-a"), create_key(store_url, "tenant-b")]
    fleet.start_worker("w1", config={"models": [{**SYNTHETIC, "max_input_tokens": 4096}]})
    gateway = fleet.start_gateway()
    outcomes = asyncio.run(drive(gateway, keys))

    crossed = [o for o in outcomes if o.status == 200 and o.answered_words != o.expected]
    assert not crossed, f"{len(crossed)} answers went to the wrong request: {crossed[:5]}"
    statuses = Counter(o.status for o in outcomes)
    # The flaky worker's cut answers are retried on another worker: every request is answered.
    assert statuses == {200: len(outcomes)}, statuses
    assert flaky_worker.seen["expect_forwarded"] == 0
    # The scenario exercised what it claims to (else the test could pass by not trying).
    for behaviour in ("interim", "cut", "stray", "answered"):
        assert flaky_worker.seen[behaviour] > 0, (behaviour, flaky_worker.seen)
    assert gateway.metric("conveyor_gateway_retries_total", model=MODEL) > 0
