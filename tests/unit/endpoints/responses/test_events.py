"""Output items and stream events from the model's text: OpenAI's event order, consecutive
sequence numbers, and every event and response valid as openai-python reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conveyor.endpoints.responses.events import ResponseBuilder
from conveyor.endpoints.responses.output import envelope, usage_object
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body

EVENT = TypeAdapter(ResponseStreamEvent)
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
USAGE = usage_object(12, 5)


def builder(tool_names: tuple[str, ...] = ()) -> ResponseBuilder:
    request = parse_body(ResponseRequest, {"model": "m", "input": "hi", "tools": TOOLS})
    return ResponseBuilder(envelope(request, "resp_1", 100), tool_names)


def run(
    pieces: list[str], *, tool_names: tuple[str, ...] = (), is_cut: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All events of a run fed ``pieces``; each is checked against openai-python's types."""
    built = builder(tool_names)
    events = built.start()
    for piece in pieces:
        events += built.feed(piece)
    events += built.finish(is_cut=is_cut, usage=USAGE, now=101)
    for event in events:
        EVENT.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    Response.model_validate(built.response)
    return events, built.response


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"].removeprefix("response.") for event in events]


def call_block(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_text_is_one_message_in_openai_order() -> None:
    events, response = run(["Hel", "lo", "!"])
    assert kinds(events) == [
        "created", "in_progress", "output_item.added", "content_part.added",
        "output_text.delta", "output_text.delta", "output_text.delta", "output_text.done",
        "content_part.done", "output_item.done", "completed",
    ]  # fmt: skip
    [message] = response["output"]
    assert message["content"][0]["text"] == "Hello!" and message["status"] == "completed"
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )
    assert response["status"] == "completed" and response["usage"] == USAGE
    assert response["completed_at"] == 101 and response["incomplete_details"] is None
    assert events[-1]["response"] == response
    assert {e["item_id"] for e in events if "item_id" in e} == {message["id"]}


def test_text_then_a_streamed_call_are_two_items() -> None:
    block = call_block("get_weather", {"city": "Paris"})
    events, response = run(["Let me check. ", block[:30], block[30:]], tool_names=("get_weather",))
    message, call = response["output"]
    assert message["content"][0]["text"] == "Let me check. "
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith(
        "call_"
    )
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call["arguments"]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in done] == [call["arguments"]]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [
        0,
        1,
    ]


def test_a_call_cut_by_the_output_limit_is_incomplete() -> None:
    block = call_block("get_weather", {"city": "Paris"})
    events, response = run([block[:55]], tool_names=("get_weather",), is_cut=True)
    [call] = response["output"]
    assert call["status"] == "incomplete" and call["arguments"] == '{"city'
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["type"] == "response.incomplete" and "completed_at" not in response


def test_markup_that_is_no_call_stays_text() -> None:
    _, response = run(["<tool_call>not json</tool_call>"], tool_names=("get_weather",))
    [message] = response["output"]
    assert message["content"][0]["text"] == "<tool_call>not json</tool_call>"


def test_an_empty_answer_is_one_empty_message() -> None:
    events, response = run([""])
    [message] = response["output"]
    assert message["content"][0]["text"] == "" and "output_text.done" in kinds(events)


def test_logprobs_go_out_with_the_text_they_belong_to() -> None:
    built = builder()
    entry = {"token": "Hi", "bytes": [72, 105], "logprob": -0.5, "top_logprobs": []}
    built.start()
    [*_, delta] = built.feed("Hi", [entry])
    assert delta["logprobs"] == [entry]
    built.finish(is_cut=False, usage=USAGE, now=1)
    assert built.response["output"][0]["content"][0]["logprobs"] == [entry]


def test_a_failure_ends_with_response_failed_keeping_the_output() -> None:
    built = builder()
    events = [*built.start(), *built.feed("partial")]
    events += built.fail({"code": "server_error", "message": "the model failed"}, USAGE)
    for event in events:
        EVENT.validate_python(event)
    assert kinds(events)[-2:] == ["output_item.done", "failed"]
    assert built.response["status"] == "failed"
    assert built.response["error"] == {"code": "server_error", "message": "the model failed"}
    assert built.response["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize("size", [1, 3, 7])
def test_any_split_of_the_text_gives_the_same_items(size: int) -> None:
    text = "Sure. " + call_block("get_weather", {"city": "Oslo"}) + " Done."
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    _, whole = run([text], tool_names=("get_weather",))
    _, split = run(pieces, tool_names=("get_weather",))

    def shape(response: dict[str, Any]) -> list[tuple[str, str]]:
        return [(i["type"], i.get("arguments") or i.get("content", [{}])[0].get("text"))
                for i in response["output"]]  # fmt: skip

    assert shape(whole) == shape(split)
