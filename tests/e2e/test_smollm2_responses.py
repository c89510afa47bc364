"""The Responses API on the real SmolLM2-135M-Instruct, through the official ``openai``
client and the OpenAI Agents SDK, against ``conveyor serve`` with its default models.

``responses.create`` answers a question, ``responses.stream`` sends OpenAI's event
sequence, ``responses.parse`` fills a pydantic model (the schema is enforced by
constrained decoding), and a function tool runs a two-step loop: through
``previous_response_id`` and through explicit ``function_call_output`` items. The Agents
SDK, with its default model (the Responses API) and one function tool, runs the same loop
itself. As in the chat tool tests, SmolLM2 calls a tool under ``auto`` only when the
conversation shows it the format: two earlier exchanges come first (few-shot prompting).
Every response and event is checked against openai-python's own types.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
EVENT = TypeAdapter(ResponseStreamEvent)
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
GET_WEATHER = {"type": "function", "name": "get_weather",
               "description": "Get the current weather in a city", "parameters": CITY}  # fmt: skip
TOOL_RESULT = json.dumps({"temperature_c": 17})


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def client(default_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.api, api_key="unused", max_retries=0)


def checked(response: Response) -> Response:
    """The response, after checking its JSON against openai-python's ``Response``."""
    raw = response.model_dump(mode="json", exclude_unset=True, warnings=False)
    return Response.model_validate(raw)


def exchange(index: int, city: str, celsius: int) -> list[dict[str, Any]]:
    """One earlier question, the call the assistant made, the tool's answer and the reply."""
    call_id = f"call_example{index}"
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {"type": "function_call", "call_id": call_id, "name": "get_weather",
         "arguments": json.dumps({"city": city})},
        {"type": "function_call_output", "call_id": call_id,
         "output": json.dumps({"temperature_c": celsius})},
        {"role": "assistant", "content": f"It is {celsius} °C in {city}."},
    ]  # fmt: skip


QUESTION = [*exchange(1, "Rome", 21), *exchange(2, "Madrid", 22),
            {"role": "user", "content": "What is the weather in Paris?"}]  # fmt: skip


def test_create_answers_a_question(client: openai.OpenAI) -> None:
    answer = checked(client.responses.create(
        model=MODEL, input="What is the capital of France? Answer in one sentence.",
        temperature=0, max_output_tokens=32,
    ))  # fmt: skip
    assert answer.status == "completed" and "Paris" in answer.output_text
    assert answer.usage is not None and answer.usage.output_tokens > 0


def test_stream_sends_openai_s_events(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input="Say hello in one short sentence.",
                                 temperature=0, max_output_tokens=32) as events:  # fmt: skip
        seen = [event.model_dump(mode="json", exclude_unset=True) for event in events]
        final = events.get_final_response()
    for event in seen:
        EVENT.validate_python(event)
    assert [event["sequence_number"] for event in seen] == list(range(len(seen)))
    assert seen[0]["type"] == "response.created" and seen[-1]["type"] == "response.completed"
    deltas = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
    assert deltas and checked(final).output_text == deltas


def test_parse_fills_a_pydantic_model(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(model=MODEL, input="Describe a fictional person as JSON.",
                                    text_format=Person, temperature=0, max_output_tokens=48)  # fmt: skip
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Person)
    assert parsed.output_parsed.name


def called(client: openai.OpenAI, **fields: Any) -> Response:
    """The first step: SmolLM2 calls get_weather for Paris."""
    first = checked(client.responses.create(
        model=MODEL, input=QUESTION, tools=[GET_WEATHER], tool_choice="auto",  # type: ignore[arg-type]
        temperature=0, max_output_tokens=48, **fields,
    ))  # fmt: skip
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    return first


def test_a_tool_loop_through_previous_response_id(client: openai.OpenAI) -> None:
    first = called(client)
    call_id = first.output[0].call_id  # type: ignore[union-attr]
    second = checked(client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[GET_WEATHER],  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call_id, "output": TOOL_RESULT}],
        temperature=0, max_output_tokens=48,
    ))  # fmt: skip
    assert second.status == "completed" and second.previous_response_id == first.id
    assert "17" in second.output_text and "Paris" in second.output_text


def test_a_tool_loop_through_explicit_items(client: openai.OpenAI) -> None:
    first = called(client, store=False)
    call = first.output[0].model_dump(exclude_none=True)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": TOOL_RESULT}
    second = checked(client.responses.create(
        model=MODEL, input=[*QUESTION, call, output], tools=[GET_WEATHER],  # type: ignore[list-item]
        temperature=0, max_output_tokens=48, store=False,
    ))  # fmt: skip
    assert "17" in second.output_text and "Paris" in second.output_text


def test_the_agents_sdk_runs_a_two_step_tool_loop(default_server: Server) -> None:
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return TOOL_RESULT

    set_tracing_disabled(True)  # nothing leaves the machine
    set_default_openai_client(
        openai.AsyncOpenAI(base_url=default_server.api, api_key="unused", max_retries=0),
        use_for_tracing=False,
    )
    agent = Agent(name="weather", model=MODEL, tools=[get_weather],
                  model_settings=ModelSettings(temperature=0, max_tokens=48))  # fmt: skip
    result = asyncio.run(Runner.run(agent, input=QUESTION))  # type: ignore[arg-type]
    assert cities == ["Paris"] and len(result.raw_responses) == 2
    assert "17" in result.final_output and "Paris" in result.final_output
