"""In-memory stand-ins for the jobs subsystem's collaborators."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from conveyor.errors import ConveyorError
from conveyor.fakes import MemoryObjectStore
from conveyor.jobs.config import JobsConfig
from conveyor.jobs.context import JobsContext
from conveyor.jobs.keys import file_key
from conveyor.jobs.object_stores import TenantObjectStores
from conveyor.jobs.store import AsyncJobStore
from conveyor.stores import JobStore, open_job_store
from conveyor.stores.records import BatchRecord, BatchStatus, FileRecord, new_batch_id, new_file_id
from conveyor.tenants.usage import Payer, UsageEvent

ENDPOINT = "/v1/embeddings"
MODEL = "m"


class Clock:
    """A settable clock (unix seconds)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def request_line(custom_id: str, text: str, *, model: str = MODEL, url: str = ENDPOINT) -> bytes:
    """One input line for the embeddings endpoint."""
    line = {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "input": text}}  # fmt: skip
    return orjson.dumps(line)


def input_file(num_lines: int, prefix: str = "r") -> bytes:
    """A JSONL input of `num_lines` requests `r0..`, inputs `text-0..`."""
    return b"\n".join(request_line(f"{prefix}{i}", f"text-{i}") for i in range(num_lines)) + b"\n"


class FakeEndpoint:
    """`run_request` that answers each input with its text, failing or blocking on demand."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.errors: dict[str, list[ConveyorError]] = {}  # input -> errors raised in turn
        self.crash_on: set[str] = set()
        self.blocked: set[str] = set()  # inputs that wait for `gate`
        self.gate = asyncio.Event()
        self.num_waiting = 0
        self._waiting_changed = asyncio.Condition()
        self.started = asyncio.Event()

    async def __call__(self, endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
        text = str(body["input"])
        self.calls.append(text)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started.set()
        try:
            if text in self.blocked:
                async with self._waiting_changed:
                    self.num_waiting += 1
                    self._waiting_changed.notify_all()
                await self.gate.wait()
            await asyncio.sleep(0)
            if text in self.crash_on:
                raise RuntimeError(f"worker crash on {text}")
            queued = self.errors.get(text)
            if queued:
                raise queued.pop(0)
            if payer.recorder is not None:  # one token per character, a millisecond each
                usage = UsageEvent(payer.tenant, body["model"], len(text), 0, len(text) / 1000, 0.0)
                payer.recorder.record(usage, 0.0)
            return {"object": "list", "data": [{"embedding": [len(text)]}], "model": body["model"]}
        finally:
            self.in_flight -= 1


async def wait_blocked(endpoint: FakeEndpoint, count: int) -> None:
    """Wait until `count` calls wait at the gate."""
    async with endpoint._waiting_changed:
        await endpoint._waiting_changed.wait_for(lambda: endpoint.num_waiting >= count)


def make_ctx(
    store: JobStore | None = None,
    objects: MemoryObjectStore | None = None,
    endpoint: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
    clock: Clock | None = None,
    worker_id: str = "w1",
    tenant_objects: dict[str, MemoryObjectStore] | None = None,
    **config: Any,
) -> JobsContext:
    """A context over an in-memory SQLite store and object stores, with fast settings:
    ``objects`` is the default store, ``tenant_objects`` the stores of pinned tenants."""
    settings = {"lease_s": 30.0, "renew_every_s": 0.01, "poll_every_s": 0.01,
                "retry_base_s": 0.001, "retry_max_s": 0.002, **config}  # fmt: skip

    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    return JobsContext(
        store=AsyncJobStore(store or open_job_store("sqlite://:memory:")),
        objects=TenantObjectStores(objects or MemoryObjectStore(), tenant_objects or {}),
        config=JobsConfig(**settings),
        worker_id=worker_id,
        run_request=endpoint or FakeEndpoint(),
        is_model_served=lambda name: name == MODEL,
        clock=clock or Clock(),
        sleep=no_sleep,
    )


_counter = itertools.count()


def upload(ctx: JobsContext, data: bytes, tenant: str = "t") -> FileRecord:
    """Store an input file and its record."""
    file_id = new_file_id()
    ctx.objects.for_tenant(tenant).put_stream(file_key(file_id), [data])
    record = FileRecord(id=file_id, tenant=tenant, filename="in.jsonl", purpose="batch",
                        bytes=len(data), created_at=next(_counter), object_key=file_key(file_id))  # fmt: skip
    ctx.store.blocking.create_file(record)
    return record


def create_batch(
    ctx: JobsContext, file_id: str, *, window_s: float = 3600, tenant: str = "t"
) -> BatchRecord:
    """A validating batch over `file_id`."""
    now = ctx.clock()
    record = BatchRecord(id=new_batch_id(), tenant=tenant, endpoint=ENDPOINT, input_file_id=file_id,
                         completion_window="1h", created_at=int(now), expires_at=int(now + window_s))  # fmt: skip
    ctx.store.blocking.create_batch(record)
    return record


def status_of(ctx: JobsContext, batch_id: str) -> BatchStatus:
    batch = ctx.store.blocking.get_batch_any(batch_id)
    assert batch is not None
    return batch.status


def records(ctx: JobsContext, file_id: str | None, tenant: str = "t") -> list[dict[str, Any]]:
    """The JSONL records of a result file of ``tenant`` (empty for None)."""
    if file_id is None:
        return []
    data = b"".join(ctx.objects.for_tenant(tenant).iter_chunks(file_key(file_id)))
    return [orjson.loads(line) for line in data.splitlines()]
