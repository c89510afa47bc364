"""Anthropic's Messages API on the real SmolLM2-135M-Instruct, through the official
``anthropic`` client against ``conveyor serve`` with its default models on 127.0.0.1.

Every answer's raw JSON, and every streamed event, validates against the client's own
types. The tool loop mirrors the chat one (``test_smollm2_tools``): SmolLM2's template has
no tool section, so two earlier exchanges (Anthropic's ``tool_use`` and ``tool_result``
blocks) show it the format, and with ``auto`` the model makes the call itself.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0}  # the client has no sampling arguments: sent as extra body
EVENTS = TypeAdapter(RawMessageStreamEvent)
QUESTION = [{"role": "user", "content": "Name three colours."}]
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"], "additionalProperties": False}  # fmt: skip
GET_WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
               "input_schema": CITY}  # fmt: skip


@pytest.fixture(scope="module")
def client(default_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=default_server.url, api_key="unused", max_retries=0)


def created(client: anthropic.Anthropic, **params: Any) -> Message:
    """A reply, its raw JSON validated by the client's ``Message`` type."""
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=params.pop("max_tokens", 24), extra_body=GREEDY, **params
    )
    return Message.model_validate(raw.http_response.json())


def test_create_answers_a_message_and_count_tokens_counts_its_prompt(
    client: anthropic.Anthropic,
) -> None:
    message = created(client, messages=QUESTION, system="You are terse.")
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.content[0].type == "text" and message.content[0].text
    counted = client.messages.with_raw_response.count_tokens(
        model=MODEL,
        messages=QUESTION,
        system="You are terse.",  # type: ignore[arg-type]
    )
    tokens = MessageTokensCount.model_validate(counted.http_response.json())
    assert tokens.input_tokens == message.usage.input_tokens


def test_the_stream_helper_and_the_raw_events_agree_with_create(
    client: anthropic.Anthropic, default_server: Server
) -> None:
    whole = created(client, messages=QUESTION)
    with client.messages.stream(model=MODEL, max_tokens=24, messages=QUESTION,  # type: ignore[arg-type]
                                extra_body=GREEDY) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert whole.content[0].type == "text" and text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason,
                                                              whole.usage.output_tokens)  # fmt: skip
    body = {"model": MODEL, "max_tokens": 24, "messages": QUESTION, "stream": True, **GREEDY}
    names = []
    with httpx.stream("POST", f"{default_server.url}/v1/messages", json=body) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in answer.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name
                if name != "ping":
                    EVENTS.validate_python(data)
                names.append(name)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def exchange(index: int, city: str, celsius: int) -> list[dict[str, Any]]:
    """One earlier question, the assistant's tool_use, the tool_result and the reply."""
    call_id = f"toolu_example{index}"
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {"city": city}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id,
             "content": json.dumps({"temperature_c": celsius})}]},
        {"role": "assistant", "content": f"It is {celsius} °C in {city}."},
    ]  # fmt: skip


def test_a_tool_use_then_tool_result_loop_runs_two_steps(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [*exchange(1, "Rome", 21), *exchange(2, "Madrid", 22)]
    messages.append({"role": "user", "content": "What is the weather in Paris?"})
    first = created(client, messages=messages, tools=[GET_WEATHER], tool_choice={"type": "auto"},
                    max_tokens=48)  # fmt: skip
    assert first.stop_reason == "tool_use"
    call = next(block for block in first.content if block.type == "tool_use")
    assert call.name == "get_weather" and call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_")
    # The client runs the tool and hands its result back.
    messages.append(first.to_param())
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": '{"temperature_c": 17}'}]})  # fmt: skip
    second = created(client, messages=messages, tools=[GET_WEATHER], max_tokens=48)
    assert second.stop_reason == "end_turn"
    assert [block.type for block in second.content] == ["text"]
    answer = second.content[0].text if second.content[0].type == "text" else ""
    assert "17" in answer and "Paris" in answer


def test_a_named_tool_choice_gives_a_valid_call(client: anthropic.Anthropic) -> None:
    message = created(client, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                      tools=[GET_WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                      max_tokens=48)  # fmt: skip
    assert message.stop_reason == "tool_use"
    calls = [block for block in message.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, CITY)


def test_errors_come_in_anthropics_shape(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)  # type: ignore[arg-type]
    assert ErrorResponse.model_validate(missing.value.body).error.type == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=4,
                               messages=[{"role": "user", "content": [
                                   {"type": "image", "source": {"type": "url",
                                                                "url": "http://x/y.png"}}]}])  # fmt: skip
    error = ErrorResponse.model_validate(bad.value.body).error
    assert error.type == "invalid_request_error" and "image" in error.message
