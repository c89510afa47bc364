"""Message Batches on the Batch API's machinery: create, page, run once, results, cancel,
delete, tenants; on the real shard runner and supervisor over in-memory stores."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest

from conveyor.errors import InvalidRequest, NotFound
from conveyor.jobs.context import JobsContext
from conveyor.jobs.keys import file_key
from conveyor.jobs.message_batch_views import message_batch_object, public_id
from conveyor.jobs.message_batches import MessageBatches
from conveyor.jobs.supervisor import Supervisor
from conveyor.stores.records import BatchStatus
from conveyor.tenants.usage import Payer
from tests.unit.jobs.fakes import MODEL, create_batch, make_ctx, upload
from tests.unit.jobs.test_shard_runner import run_all

pytestmark = pytest.mark.anyio


async def answer(endpoint: str, body: dict[str, Any], payer: Payer) -> dict[str, Any]:
    """A Messages endpoint that echoes the prompt, refusing a `max_tokens` over 100."""
    if body["max_tokens"] > 100:
        raise InvalidRequest("max_tokens is too large for this model", param="max_tokens")
    text = body["messages"][0]["content"]
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip


def create_body(num: int, *, max_tokens: int = 8, prefix: str = "r") -> bytes:
    requests = [{"custom_id": f"{prefix}{i}", "params": {
        "model": MODEL, "max_tokens": max_tokens if i != 1 else 500,
        "messages": [{"role": "user", "content": f"say {i}"}]}} for i in range(num)]  # fmt: skip
    return orjson.dumps({"requests": requests})


def batches(**config: Any) -> tuple[MessageBatches, JobsContext]:
    ctx = make_ctx(endpoint=answer, lines_per_shard=2, **config)
    return MessageBatches(ctx, lambda: None), ctx


async def run_to_end(ctx: JobsContext) -> None:
    supervisor = Supervisor(ctx, asyncio.Event())
    await supervisor.tick()
    await run_all(ctx)
    await supervisor.tick()


async def results_of(api: MessageBatches, batch_id: str, tenant: str = "t") -> dict[str, Any]:
    lines = await api.results(tenant, batch_id)
    found = [orjson.loads(line) for line in await asyncio.to_thread(list, lines)]
    by_id = {line["custom_id"]: line["result"] for line in found}
    assert len(by_id) == len(found)  # each request once
    return by_id


async def test_a_batch_runs_each_request_once_and_reads_back_as_results() -> None:
    api, ctx = batches()
    created = await api.create("t", create_body(5))
    batch_id = public_id(created.id)
    assert message_batch_object(created)["request_counts"]["processing"] == 5
    with pytest.raises(InvalidRequest, match="not ended yet"):
        await api.results("t", batch_id)
    await run_to_end(ctx)
    ended = await api.get("t", batch_id)
    counts = message_batch_object(ended)["request_counts"]
    assert (counts["succeeded"], counts["errored"], counts["processing"]) == (4, 1, 0)
    found = await results_of(api, batch_id)
    assert sorted(found) == [f"r{i}" for i in range(5)]
    assert found["r3"]["message"]["content"][0]["text"] == "say 3"
    assert found["r1"]["type"] == "errored"
    assert found["r1"]["error"]["error"]["type"] == "invalid_request_error"
    # The requests stay as a file of the tenant's until the batch is deleted.
    source = ctx.store.blocking.get_file("t", ended.input_file_id)
    assert source is not None and source.purpose == "message_batch"


async def test_cancelling_ends_unrun_requests_as_canceled() -> None:
    api, ctx = batches()
    created = await api.create("t", create_body(3))
    cancelling = await api.cancel("t", public_id(created.id))
    assert message_batch_object(cancelling)["processing_status"] == "canceling"
    await run_to_end(ctx)
    ended = await api.get("t", created.id)
    assert ended.status is BatchStatus.CANCELLED
    assert message_batch_object(ended)["request_counts"]["canceled"] == 3
    assert {r["type"] for r in (await results_of(api, created.id)).values()} == {"canceled"}
    assert (await api.cancel("t", created.id)).status is BatchStatus.CANCELLED  # as it is


async def test_a_cancel_holds_when_the_batch_is_planned_between_its_read_and_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, ctx = batches()
    created = await api.create("t", create_body(5))
    read = api.get

    async def read_then_plan(tenant: str, batch_id: str) -> Any:
        """The cancel's read sees `validating`; the supervisor plans the batch right after."""
        record = await read(tenant, batch_id)
        if record.status is BatchStatus.VALIDATING:
            await Supervisor(ctx, asyncio.Event()).tick()
            assert (await read(tenant, batch_id)).status is BatchStatus.IN_PROGRESS
        return record

    monkeypatch.setattr(api, "get", read_then_plan)
    cancelling = await api.cancel("t", public_id(created.id))
    assert message_batch_object(cancelling)["processing_status"] == "canceling"
    await run_to_end(ctx)
    assert message_batch_object(await read("t", created.id))["request_counts"]["canceled"] == 5


async def test_delete_needs_an_ended_batch_and_takes_its_files() -> None:
    api, ctx = batches()
    created = await api.create("t", create_body(2))
    with pytest.raises(InvalidRequest, match="cancel it first"):
        await api.delete("t", public_id(created.id))
    await run_to_end(ctx)
    ended = await api.get("t", created.id)
    assert ended.output_file_id is not None and ended.error_file_id is not None
    assert await api.delete("t", public_id(created.id)) == created.id
    with pytest.raises(NotFound):
        await api.get("t", created.id)
    assert ctx.store.blocking.get_file("t", ended.output_file_id) is None
    for file_id in (ended.input_file_id, ended.output_file_id, ended.error_file_id):
        assert ctx.store.blocking.get_file("t", file_id) is None
        assert not ctx.objects.default.exists(file_key(file_id))


async def test_pages_hold_only_the_tenants_message_batches() -> None:
    api, ctx = batches()
    made = [await api.create("t", create_body(1, prefix=f"p{i}")) for i in range(5)]
    openai_batch = create_batch(ctx, upload(ctx, b"{}\n").id)
    other = await api.create("u", create_body(1))
    newest = [public_id(b.id) for b in reversed(made)]
    first, has_more = await api.list_page("t", limit=2, after_id=None, before_id=None)
    assert [public_id(b.id) for b in first] == newest[:2] and has_more
    rest, has_more = await api.list_page("t", limit=20, after_id=newest[1], before_id=None)
    assert [public_id(b.id) for b in rest] == newest[2:] and not has_more
    newer, has_more = await api.list_page("t", limit=2, after_id=None, before_id=newest[4])
    assert [public_id(b.id) for b in newer] == newest[2:4] and has_more
    for foreign in (public_id(other.id), openai_batch.id, "msgbatch_nope", "nonsense"):
        with pytest.raises(NotFound):
            await api.get("t", foreign)


async def test_a_model_not_served_is_refused_at_creation() -> None:
    api, _ = batches()
    body = orjson.dumps({"requests": [{"custom_id": "a", "params": {"model": "other"}}]})
    with pytest.raises(InvalidRequest, match="not served"):
        await api.create("t", body)


async def test_a_batch_that_fails_before_running_reports_each_request_errored() -> None:
    api, ctx = batches()
    created = await api.create("t", create_body(3))
    gone = dataclasses.replace(ctx, is_model_served=lambda name: False)  # unloaded since
    await Supervisor(gone, asyncio.Event()).tick()
    failed = await api.get("t", created.id)
    assert failed.status is BatchStatus.FAILED
    assert message_batch_object(failed)["request_counts"]["errored"] == 3
    found = await results_of(api, created.id)
    assert sorted(found) == ["r0", "r1", "r2"]
    assert all(r["type"] == "errored" for r in found.values())


async def test_message_batches_have_their_own_bound_on_requests() -> None:
    api, ctx = batches(max_requests_per_batch=2, max_requests_per_message_batch=4)
    created = await api.create("t", create_body(4))  # over the Batch API's bound, within its own
    await run_to_end(ctx)
    ended = await api.get("t", created.id)
    assert ended.status is BatchStatus.COMPLETED
    with pytest.raises(InvalidRequest, match="at most 4 requests"):
        await api.create("t", create_body(5))
