"""The Responses API of a real `serve` on a tiny random Llama, through the official client:
create, stream, continue with previous_response_id, list input items, delete, background
runs polled and cancelled, tenants kept apart, hosted tools refused, and batches of
/v1/responses lines. Every response and every stream event is checked against
openai-python's own types (the client itself builds them without checking)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conveyor.fakes.checkpoints import build_tiny_llama
from tests import polling
from tests.e2e.conftest import Server, start_server, stop_server
from tests.e2e.test_batch_api import FAST_JOBS, jsonl, results, submit
from tests.e2e.test_batch_api import wait_until as wait_for_batch

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
KEY_A = "sk-responses-a-0123456789"
KEY_B = "sk-responses-b-0123456789"
EVENT = TypeAdapter(ResponseStreamEvent)
WAIT_S = 60.0
WEATHER = {"type": "function", "name": "get_weather", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = build_tiny_llama(tmp_path_factory.mktemp("responses-llama"))
    generate = {
        "name": MODEL, "kind": "generate", "path": str(checkpoint), "device": "cpu",
        "kv_cache_tokens": 8192, "max_num_seqs": 8, "max_num_batched_tokens": 512, "threads": 1,
    }  # fmt: skip
    config = {
        "models": [generate],
        "api_keys": [{"key": KEY_A, "tenant": "a"}, {"key": KEY_B, "tenant": "b"}],
        "jobs": FAST_JOBS,
    }
    running = start_server(tmp_path_factory.mktemp("responses-server"), config)
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def other_tenant(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=KEY_B, max_retries=0)


def create(client: openai.OpenAI, **fields: Any) -> dict[str, Any]:
    """``responses.create``'s JSON, checked as a ``Response``."""
    body = {"model": MODEL, "max_output_tokens": 16, "temperature": 0, **fields}
    raw = client.responses.with_raw_response.create(**body)
    data: dict[str, Any] = json.loads(raw.text)
    Response.model_validate(data)
    return data


def stream(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every server-sent event of a streamed response, each checked as a stream event."""
    events: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {KEY_A}"}
    body = {"model": MODEL, "temperature": 0, **body, "stream": True}
    with httpx.stream("POST", f"{server.api}/responses", json=body, headers=headers,
                      timeout=60) as answer:  # fmt: skip
        assert answer.status_code == 200
        kind = None
        for line in answer.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == kind
                EVENT.validate_python(event)
                events.append(event)
    return events


def poll(client: openai.OpenAI, response_id: str, *, until: tuple[str, ...]) -> Any:
    """Retrieve the response until its status is one of ``until``."""
    return polling.until(
        lambda: r if (r := client.responses.retrieve(response_id)).status in until else None,
        f"{response_id} to be {until}", timeout_s=WAIT_S, interval_s=0.02,
    )  # fmt: skip


def test_a_response_is_created_retrieved_and_deleted_by_its_tenant_only(
    client: openai.OpenAI, other_tenant: openai.OpenAI
) -> None:
    made = create(client, input="Tell me a story.", instructions="Be brief.", metadata={"k": "v"})
    assert made["status"] in ("completed", "incomplete") and made["output"][0]["type"] == "message"
    assert made["usage"]["output_tokens"] > 0 and made["usage"]["input_tokens"] > 0
    assert (made["instructions"], made["metadata"], made["store"]) == (
        "Be brief.",
        {"k": "v"},
        True,
    )
    again = client.responses.retrieve(made["id"])
    assert again.model_dump(exclude_none=True) == Response.model_validate(made).model_dump(
        exclude_none=True
    )
    for call in (other_tenant.responses.retrieve, other_tenant.responses.delete,
                 other_tenant.responses.input_items.list, other_tenant.responses.cancel):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call(made["id"])
    client.responses.delete(made["id"])
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made["id"])


def test_stream_events_arrive_in_order_and_the_last_one_is_stored(
    server: Server, client: openai.OpenAI
) -> None:
    events = stream(server, {"input": "Count with me.", "max_output_tokens": 20})
    kinds = [event["type"] for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]  # fmt: skip
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    final = events[-1]["response"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == deltas
    stored = client.responses.retrieve(final["id"])
    assert stored.output_text == deltas and stored.usage is not None


def test_previous_response_id_continues_and_input_items_page(client: openai.OpenAI) -> None:
    first = create(client, input="First question.")
    second = create(client, input="Second question.", previous_response_id=first["id"])
    third = create(client, input="Third question.", previous_response_id=second["id"])
    assert third["previous_response_id"] == second["id"]
    assert third["usage"]["input_tokens"] > second["usage"]["input_tokens"]
    items = list(client.responses.input_items.list(third["id"], limit=2))  # pages of two
    roles = [item.role for item in items if item.type == "message"]
    assert roles == ["user", "assistant", "user", "assistant", "user"]  # newest first
    assert items[0].content[0].text == "Third question."  # type: ignore[union-attr]
    oldest = client.responses.input_items.list(third["id"], order="asc", limit=1)
    assert oldest.data[0].content[0].text == "First question."  # type: ignore[union-attr]
    assert oldest.has_more


def test_an_unstored_response_cannot_be_continued(client: openai.OpenAI) -> None:
    made = create(client, input="Forget this.", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made["id"])
    with pytest.raises(openai.NotFoundError) as caught:
        create(client, input="Go on.", previous_response_id=made["id"])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "previous_response_id"


def test_function_call_output_items_run_without_storage(client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "Weather in Paris?"}]
    called = create(client, input=question, tools=[WEATHER], tool_choice="required",
                    store=False, max_output_tokens=64)  # fmt: skip
    [call] = called["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert set(json.loads(call["arguments"])) == {"city"} and call["call_id"].startswith("call_")
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"c": 17}'}
    answered = create(client, input=[*question, call, result], tools=[WEATHER], store=False)
    assert answered["output"][0]["type"] == "message"
    assert answered["usage"]["input_tokens"] > called["usage"]["input_tokens"]


def test_a_background_response_is_polled_and_another_is_cancelled(client: openai.OpenAI) -> None:
    short = create(client, input="Quick one.", background=True)
    assert short["status"] == "queued" and short["background"]
    done = poll(client, short["id"], until=("completed", "incomplete"))
    Response.model_validate(done.model_dump())
    assert done.usage is not None and done.usage.output_tokens > 0 and done.output
    long = create(client, input="A long one.", background=True, max_output_tokens=900)
    poll(client, long["id"], until=("in_progress",))
    cancelled = client.responses.cancel(long["id"])
    assert cancelled.status == "cancelled" and cancelled.output == []
    assert client.responses.retrieve(long["id"]).status == "cancelled"
    assert client.responses.cancel(long["id"]).status == "cancelled"  # twice: as it is


def test_hosted_tools_are_refused_by_name(client: openai.OpenAI) -> None:
    for tool in (
        {"type": "web_search"},
        {"type": "code_interpreter", "container": {"type": "auto"}},
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            create(client, input="Search.", tools=[tool])
        assert repr(tool["type"]) in str(caught.value)


def test_a_batch_of_responses_lines_runs_with_usage(client: openai.OpenAI) -> None:
    lines = [{"custom_id": f"r-{i}", "method": "POST", "url": "/v1/responses",
              "body": {"model": MODEL, "input": f"Line {i}", "max_output_tokens": 16}}
             for i in range(4)]  # fmt: skip
    lines[3]["body"]["previous_response_id"] = "resp_x"  # a batch line runs on its own
    batch = wait_for_batch(client, submit(client, jsonl(lines), endpoint="/v1/responses").id)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    outputs, errors = results(client, batch)
    bodies = [Response.model_validate(r["response"]["body"]) for r in outputs]
    assert sorted(r["custom_id"] for r in outputs) == ["r-0", "r-1", "r-2"]
    assert errors[0]["response"]["status_code"] == 400
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(b.usage.output_tokens for b in bodies if b.usage)
    assert batch.usage.input_tokens == sum(b.usage.input_tokens for b in bodies if b.usage)
