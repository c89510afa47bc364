"""Stored responses per tenant on the in-memory job store: continuing a conversation,
retrieval, input item pages, deletion, cancellation and queueing background runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response

from conveyor.endpoints.responses.input import input_items
from conveyor.endpoints.responses.output import envelope, response_object
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.responses.stored import StoredResponses, finished_body, job_body
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest, NotFound
from conveyor.fakes import MemoryJobStore
from conveyor.response_ids import new_response_id

pytestmark = pytest.mark.anyio

ANSWER = {"id": "msg_a", "type": "message", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}  # fmt: skip


def request(**fields: Any) -> ResponseRequest:
    return parse_body(ResponseRequest, {"model": "m", "input": "Capital of France?", **fields})


async def saved(stored: StoredResponses, tenant: str = "acme", **fields: Any) -> dict[str, Any]:
    """A finished response stored as the route stores one; its body."""
    parsed = request(**fields)
    context = await stored.context_of(tenant, parsed.previous_response_id)
    base = envelope(parsed, new_response_id(parsed.previous_response_id), 1)
    response = response_object(base, status="completed", output=[ANSWER])
    await stored.save(tenant, response, [*context, *input_items(parsed)])
    return response


async def test_a_stored_response_is_its_tenant_s_only() -> None:
    stored = StoredResponses(MemoryJobStore())
    response = await saved(stored)
    assert await stored.get("acme", response["id"]) == response
    for call in (stored.get, stored.delete, stored.cancel, stored.input_items):
        with pytest.raises(NotFound):
            await call("other", response["id"])
    with pytest.raises(NotFound) as caught:
        await stored.context_of("other", response["id"])
    assert caught.value.param == "previous_response_id"


async def test_a_next_turn_continues_from_the_items_and_the_output() -> None:
    stored = StoredResponses(MemoryJobStore())
    first = await saved(stored)
    second = await saved(stored, input="And of Italy?", previous_response_id=first["id"])
    context = await stored.context_of("acme", second["id"])
    texts = [item["content"][0]["text"] for item in context]
    assert texts == ["Capital of France?", "Paris.", "And of Italy?", "Paris."]
    page = await stored.input_items("acme", second["id"], order="asc")
    assert [item["content"][0]["text"] for item in page["data"]] == texts[:3]


async def test_input_items_are_paged_newest_first() -> None:
    stored = StoredResponses(MemoryJobStore())
    turns = [{"role": "user", "content": str(i)} for i in range(5)]
    response = await saved(stored, input=turns)
    first = await stored.input_items("acme", response["id"], limit=2)
    assert [i["content"][0]["text"] for i in first["data"]] == ["4", "3"] and first["has_more"]
    assert first["first_id"] == first["data"][0]["id"] and first["object"] == "list"
    rest = await stored.input_items("acme", response["id"], after=first["last_id"], limit=5)
    assert [i["content"][0]["text"] for i in rest["data"]] == ["2", "1", "0"]
    assert not rest["has_more"]
    assert (await stored.input_items("acme", response["id"], after="msg_nope"))["data"] == []
    with pytest.raises(InvalidRequest):
        await stored.input_items("acme", response["id"], limit=101)


async def test_delete_forgets_the_response() -> None:
    stored = StoredResponses(MemoryJobStore())
    response = await saved(stored)
    assert await stored.delete("acme", response["id"]) == {
        "id": response["id"], "object": "response", "deleted": True}  # fmt: skip
    with pytest.raises(NotFound):
        await stored.get("acme", response["id"])


async def test_a_queued_background_response_runs_on_its_own() -> None:
    woken: list[bool] = []
    store = MemoryJobStore()
    stored = StoredResponses(store, wake_runner=lambda: woken.append(True), clock=lambda: 50.0)
    first = await saved(stored)
    parsed = request(input="And Spain?", previous_response_id=first["id"], background=True,
                     instructions="Be brief.", metadata={"k": "v"})  # fmt: skip
    queued = await stored.queue("acme", parsed, await stored.context_of("acme", first["id"]))
    Response.model_validate(queued)
    assert queued["status"] == "queued" and queued["background"] and woken == [True]
    assert queued["previous_response_id"] == first["id"] and queued["created_at"] == 50
    row = store.get_response("acme", queued["id"])
    assert row is not None and row.job is not None
    job = json.loads(row.job)
    assert not {"previous_response_id", "background", "store"} & set(job)
    assert [item["content"][0]["text"] for item in job["input"]] == [
        "Capital of France?", "Paris.", "And Spain?"]  # fmt: skip
    assert job["instructions"] == "Be brief." and job["input"] == json.loads(row.input_items)
    with pytest.raises(InvalidRequest, match="still queued"):
        await stored.context_of("acme", queued["id"])


async def test_cancel_ends_a_queued_response_and_leaves_others_alone() -> None:
    stored = StoredResponses(MemoryJobStore())
    queued = await stored.queue("acme", request(background=True), [])
    cancelled = await stored.cancel("acme", queued["id"])
    assert cancelled["status"] == "cancelled" and cancelled["output"] == []
    assert (await stored.cancel("acme", queued["id"]))["status"] == "cancelled"  # again: as is
    finished = await saved(stored)
    with pytest.raises(InvalidRequest, match="only background"):
        await stored.cancel("acme", finished["id"])


def test_a_run_s_result_fills_the_stored_body() -> None:
    base = envelope(request(background=True, metadata={"k": "v"}), "resp_1", 1)
    result = {**response_object(envelope(request(), "resp_other", 2), status="incomplete",
                                output=[ANSWER]), "metadata": {}}  # fmt: skip
    body = finished_body(base, result)
    assert (body["id"], body["created_at"], body["metadata"], body["background"]) == (
        "resp_1", 1, {"k": "v"}, True)  # fmt: skip
    assert body["status"] == "incomplete" and body["output"] == [ANSWER]
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_job_body_is_a_valid_request_of_its_own() -> None:
    parsed = request(text={"format": {"type": "json_schema", "name": "p", "schema": {}}},
                     tools=[{"type": "function", "name": "f"}], tool_choice="auto")  # fmt: skip
    body = job_body(parsed, input_items(parsed))
    again = parse_body(ResponseRequest, body)
    assert again.text is not None and again.text.format is not None
    assert again.text.format.schema_ == {} and again.tool_names == ("f",)
