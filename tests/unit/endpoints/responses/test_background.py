"""Background responses on the in-memory job store: claimed, run as batch lines run, written
once by the attempt that holds them; cancelled, taken over, failed, or handed back. The
clock is explicit; only the lease heartbeat waits on wall time (a hundredth of a second)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from conveyor.endpoints.responses.background import BackgroundRunner
from conveyor.endpoints.responses.output import envelope, response_object, usage_object
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.responses.stored import StoredResponses
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest, QueueFull
from conveyor.fakes import MemoryJobStore
from conveyor.jobs.context import JobsContext
from conveyor.stores.response_records import ResponseStatus
from conveyor.tenants.usage import Payer, UsageEvent
from tests.unit.jobs.fakes import Clock, make_ctx

pytestmark = pytest.mark.anyio

LEASE_S = 30.0
ANSWER = {"id": "msg_a", "type": "message", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}  # fmt: skip


class FakeResponses:
    """`run_request` for /v1/responses: answers at once, fails, or waits at `gate`."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.errors: list[Exception] = []
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
        self.calls.append(body)
        self.started.set()
        if self.errors:
            raise self.errors.pop(0)
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if payer.recorder is not None:
            payer.recorder.record(UsageEvent(payer.tenant, body["model"], 9, 4, 0.1, 0.0), 0.0)
        base = envelope(parse_body(ResponseRequest, body), "resp_run", 2)
        return response_object(base, status="completed", output=[ANSWER], usage=usage_object(9, 4))


def setup(**config: Any) -> tuple[JobsContext, MemoryJobStore, FakeResponses, BackgroundRunner]:
    store = MemoryJobStore()
    ctx = make_ctx(store, clock=Clock(1000.0), lease_s=LEASE_S, **config)
    endpoint = FakeResponses()
    return ctx, store, endpoint, BackgroundRunner(ctx, endpoint, lambda model: model == "m")


async def queue(store: MemoryJobStore, model: str = "m") -> str:
    body = {"model": model, "input": "Do it.", "background": True}
    queued = await StoredResponses(store).queue("acme", parse_body(ResponseRequest, body), [])
    return str(queued["id"])


def row_of(store: MemoryJobStore, response_id: str) -> Any:
    row = store.get_response("acme", response_id)
    assert row is not None
    return row


async def test_a_queued_response_runs_and_is_written_once_with_its_usage() -> None:
    _, store, endpoint, runner = setup()
    response_id = await queue(store)
    await asyncio.gather(*await runner.claim_some())
    row = row_of(store, response_id)
    body = json.loads(row.body)
    assert row.status is ResponseStatus.COMPLETED and row.job is None
    assert body["id"] == response_id and body["background"] and body["output"] == [ANSWER]
    assert body["usage"]["output_tokens"] == 4
    assert [u.input_tokens for u in store.list_usage(0)] == [9]
    assert endpoint.calls[0]["input"][0]["content"][0]["text"] == "Do it."
    assert await runner.claim_some() == []  # nothing left to run


async def test_only_models_this_process_runs_are_claimed() -> None:
    _, store, endpoint, runner = setup()
    response_id = await queue(store, model="elsewhere")
    assert await runner.claim_some() == []
    assert row_of(store, response_id).status is ResponseStatus.QUEUED and endpoint.calls == []


async def test_back_pressure_is_waited_out_and_a_bad_request_fails_the_response() -> None:
    _, store, endpoint, runner = setup()
    endpoint.errors = [QueueFull("full", retry_after_s=1)]
    waited = await queue(store)
    await asyncio.gather(*await runner.claim_some())
    assert row_of(store, waited).status is ResponseStatus.COMPLETED
    endpoint.errors = [InvalidRequest("this model's maximum context length is 8 tokens")]
    failed = await queue(store)
    await asyncio.gather(*await runner.claim_some())
    row = row_of(store, failed)
    assert row.status is ResponseStatus.FAILED
    assert json.loads(row.body)["error"] == {
        "code": "invalid_prompt", "message": "this model's maximum context length is 8 tokens"}  # fmt: skip


async def test_a_cancel_stops_the_run_and_nothing_is_written() -> None:
    _, store, endpoint, runner = setup()
    endpoint.gate = asyncio.Event()
    response_id = await queue(store)
    [run] = await runner.claim_some()
    await endpoint.started.wait()
    cancelled = await StoredResponses(store).cancel("acme", response_id)
    await run  # the next heartbeat finds the run gone
    assert cancelled["status"] == "cancelled" and endpoint.cancelled == 1
    assert row_of(store, response_id).status is ResponseStatus.CANCELLED
    assert store.list_usage(0) == []


async def test_a_run_taken_over_after_its_lease_lapsed_writes_nothing() -> None:
    ctx, store, endpoint, runner = setup()
    endpoint.gate = asyncio.Event()
    response_id = await queue(store)
    [run] = await runner.claim_some()
    await endpoint.started.wait()
    assert isinstance(ctx.clock, Clock)
    ctx.clock.now += LEASE_S + 1  # the lease lapsed: another worker takes the response over
    other = store.claim_response(response_id, "w2", ctx.clock(), LEASE_S)
    assert other is not None and other.attempt == 2
    await run
    row = row_of(store, response_id)
    assert (row.status, row.lease_owner) == (ResponseStatus.IN_PROGRESS, "w2")
    assert endpoint.cancelled == 1 and store.list_usage(0) == []


async def test_a_response_that_keeps_killing_its_worker_fails_with_the_reason() -> None:
    ctx, store, endpoint, runner = setup(isolate_after_attempts=1)
    response_id = await queue(store)
    assert isinstance(ctx.clock, Clock)
    for worker in ("dead-1", "dead-2"):  # each claim's worker died mid-run
        assert store.claim_response(response_id, worker, ctx.clock(), LEASE_S) is not None
        ctx.clock.now += LEASE_S
    await asyncio.gather(*await runner.claim_some())
    row = row_of(store, response_id)
    assert row.status is ResponseStatus.FAILED and endpoint.calls == []
    assert "interrupted 2 times" in json.loads(row.body)["error"]["message"]


async def test_a_crashing_run_is_handed_back_and_fails_once_its_tries_are_spent() -> None:
    _, store, endpoint, runner = setup(isolate_after_attempts=1)
    response_id = await queue(store)
    for attempt in (1, 2):
        endpoint.errors = [RuntimeError("the model thread died")]
        await asyncio.gather(*await runner.claim_some())
        row = row_of(store, response_id)
        assert (row.status, row.attempt) == (ResponseStatus.QUEUED, attempt)
    await asyncio.gather(*await runner.claim_some())
    row = row_of(store, response_id)
    assert row.status is ResponseStatus.FAILED and len(endpoint.calls) == 2
    assert "crashed" in json.loads(row.body)["error"]["message"]


async def test_stopping_hands_a_running_response_back() -> None:
    _, store, endpoint, runner = setup()
    endpoint.gate = asyncio.Event()
    response_id = await queue(store)
    await runner.claim_some()
    await endpoint.started.wait()
    await runner.stop()
    row = row_of(store, response_id)
    assert (row.status, row.attempt, row.lease_owner) == (ResponseStatus.QUEUED, 1, None)
