"""A Messages request as the chat request the engine runs, and the 400s of its schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conveyor.endpoints.messages.convert import to_chat
from conveyor.endpoints.messages.run import parse_count_tokens_request, parse_messages_request
from conveyor.errors import InvalidRequest

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
            **fields}  # fmt: skip


def chat_of(**fields: Any) -> dict[str, Any]:
    converted = to_chat(parse_messages_request(body(**fields)))
    return converted.chat.model_dump(exclude_none=True)


def test_system_blocks_and_text_blocks_become_plain_messages() -> None:
    chat = chat_of(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}],
    )  # fmt: skip
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "a\nb"},
    ]
    assert chat["max_tokens"] == 16 and "stop" not in chat


def test_a_tool_loop_becomes_tool_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "17 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no data"}]},
            {"type": "text", "text": "Thanks"},
        ]},
    ]  # fmt: skip
    tools = [{"name": "weather", "description": "Weather now", "input_schema": WEATHER}]
    chat = chat_of(messages=messages, tools=tools)
    assistant, first, second, user = chat["messages"][1:]
    assert assistant["content"] == "Checking."
    calls = assistant["tool_calls"]
    assert [c["id"] for c in calls] == ["toolu_1", "toolu_2"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}
    assert first == {"role": "tool", "tool_call_id": "toolu_1", "content": "17 C"}
    assert second == {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no data"}
    assert user == {"role": "user", "content": "Thanks"}
    function = chat["tools"][0]["function"]
    assert function == {"name": "weather", "description": "Weather now", "parameters": WEATHER}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "weather"},
            {"type": "function", "function": {"name": "weather"}},
        ),
    ],
)
def test_tool_choice_maps_to_the_chat_choice(choice: dict[str, Any], expected: Any) -> None:
    tools = [{"name": "weather", "input_schema": WEATHER}]
    chat = chat_of(tools=tools, tool_choice={**choice, "disable_parallel_tool_use": True})
    assert chat["tool_choice"] == expected
    assert chat["parallel_tool_calls"] is False


def test_sampling_stops_and_the_output_format_carry_over() -> None:
    chat = chat_of(temperature=0.5, top_p=0.9, top_k=40, stop_sequences=["\n\n", "END"],
                   output_config={"format": {"type": "json_schema", "schema": WEATHER},
                                  "effort": "low"},
                   metadata={"user_id": "u1"}, service_tier="auto")  # fmt: skip
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.5, 0.9, 40)
    assert chat["stop"] == ["\n\n", "END"]
    assert chat["response_format"]["json_schema"]["schema_"] == WEATHER


def test_a_final_assistant_turn_is_a_prefill() -> None:
    converted = to_chat(parse_messages_request(body(messages=[
        {"role": "user", "content": "Pick A or B."},
        {"role": "assistant", "content": [{"type": "text", "text": "The answer is ("}]},
    ])))  # fmt: skip
    assert converted.prefill == "The answer is ("
    assert [m.role for m in converted.chat.messages] == ["user"]


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "ends with space "}],
         "trailing whitespace"),
        ([{"role": "assistant", "content": "alone"}], "start with a user message"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "weather", "input": {}}]}],
         "may only hold text"),
    ],
)  # fmt: skip
def test_prefills_that_cannot_run_are_400(messages: list[Any], fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        to_chat(parse_messages_request(body(messages=messages)))


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
         "type 'image' are not supported"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "server tool 'web_search_20250305'"),
        ({"tools": [{"name": "a", "input_schema": WEATHER}],
          "tool_choice": {"type": "tool", "name": "b"}}, "unknown tool 'b'"),
        ({"tool_choice": {"type": "any"}}, "needs tools"),
        ({"messages": [{"role": "user", "content": [
            {"type": "tool_use", "id": "t", "name": "a", "input": {}}]}]}, "assistant messages"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"temperature": 1.5}, "temperature"),
        ({"container": "x"}, "unrecognized request argument: 'container'"),
    ],
)  # fmt: skip
def test_bodies_conveyor_cannot_run_are_400_naming_the_problem(
    fields: dict[str, Any], fragment: str
) -> None:
    raw = {key: value for key, value in body(**fields).items() if value is not None}
    with pytest.raises(InvalidRequest, match=fragment):
        parse_messages_request(raw)


def test_count_tokens_takes_the_conversation_without_generation_settings() -> None:
    request = parse_count_tokens_request({"model": "m", "messages": [{"role": "user",
                                                                       "content": "hi"}]})  # fmt: skip
    assert to_chat(request).chat.messages[0].text == "hi"
    with pytest.raises(InvalidRequest, match="max_tokens"):
        parse_count_tokens_request({**body(), "max_tokens": 4})
