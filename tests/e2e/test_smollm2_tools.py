"""Structured output and tool calls on the real SmolLM2-135M-Instruct, through the official
``openai`` client against ``conveyor serve`` with its default models on 127.0.0.1.

A ``json_schema`` response format gives JSON valid for the schema; a named ``tool_choice``
gives one call to that function with arguments valid for its parameters; and an ``auto``
tool loop runs two steps: the model calls the tool, the client runs it and sends the
result back, and the model answers in words with the tool's figure.

SmolLM2's chat template has no tool section, so Conveyor's fallback lists the tools in a
system message. A 135M model does not act on that alone; two earlier exchanges in the
conversation (a question, the assistant's call, the tool's result, the answer) show it the
format, as few-shot prompting does. With ``auto`` nothing forces the call: the model makes it.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A ``tools`` entry."""
    body = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": body}


GET_WEATHER = function("get_weather", "Get the current weather in a city", CITY)
TOOLS = [
    function("get_weather", "Get the current weather in a city", WEATHER),
    function("get_time", "Get the current time in a city", CITY),
]


@pytest.fixture(scope="module")
def client(default_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.api, api_key="unused")


def test_a_json_schema_gives_json_valid_for_it(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a fictional person as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
        temperature=0,
        max_completion_tokens=96,
    )
    assert reply.choices[0].finish_reason == "stop"
    content = reply.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), PERSON)


def test_a_named_tool_choice_gives_a_valid_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_completion_tokens=64,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].type == "function"
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)


def exchange(index: int, city: str, celsius: int) -> list[dict[str, Any]]:
    """One earlier question, the assistant's call, the tool's answer and the reply."""
    call_id = f"call_example{index}"
    call = {"name": "get_weather", "arguments": json.dumps({"city": city})}
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": call_id, "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temperature_c": celsius})},
        {"role": "assistant", "content": f"It is {celsius} °C in {city}."},
    ]  # fmt: skip


def test_an_auto_tool_loop_runs_two_steps(client: openai.OpenAI) -> None:
    messages: list[Any] = [*exchange(1, "Rome", 21), *exchange(2, "Madrid", 22)]
    messages.append({"role": "user", "content": "What is the weather in Paris?"})
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[GET_WEATHER], tool_choice="auto",  # type: ignore[list-item]
        temperature=0, max_completion_tokens=48,
    )  # fmt: skip
    assert first.choices[0].finish_reason == "tool_calls"
    call = (first.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The client runs the tool and hands its result back.
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 17}'})
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[GET_WEATHER], tool_choice="auto",  # type: ignore[list-item]
        temperature=0, max_completion_tokens=48,
    )  # fmt: skip
    answer = second.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert answer.message.content is not None
    assert "17" in answer.message.content and "Paris" in answer.message.content
