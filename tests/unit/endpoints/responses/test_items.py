"""A conversation's items as the chat request the chat path runs."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.endpoints.chat_schemas import NamedToolChoice
from conveyor.endpoints.responses.input import input_items
from conveyor.endpoints.responses.items import chat_messages, chat_request
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}


def request(**fields: Any) -> ResponseRequest:
    return parse_body(ResponseRequest, {"model": "m", "input": "hi", **fields})


def conversation(*raw: dict[str, Any]) -> list[dict[str, Any]]:
    return input_items(request(input=list(raw)))


def test_instructions_come_first_and_developer_text_is_system() -> None:
    items = conversation(
        {"role": "developer", "content": "Rules"}, {"role": "user", "content": "Q"}
    )
    assert chat_messages("Be brief.", items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Rules"},
        {"role": "user", "content": "Q"},
    ]


def test_calls_join_the_assistant_message_before_them_and_outputs_are_tool_messages() -> None:
    items = conversation(
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "reasoning", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "17"},
        {"type": "function_call_output", "call_id": "c2", "output": "21"},
        {"type": "function_call", "call_id": "c3", "name": "get_time", "arguments": "{}"},
    )  # fmt: skip
    messages = chat_messages(None, items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[1]["content"] == "Let me look."
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[1]["tool_calls"][1]["function"] == {
        "name": "get_weather", "arguments": '{"city": "Rome"}'}  # fmt: skip
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "17"}
    # A call with no assistant text before it gets an assistant message of its own.
    assert messages[4]["content"] == "" and messages[4]["tool_calls"][0]["id"] == "c3"


def test_the_body_maps_onto_chat_fields() -> None:
    chat = chat_request(
        request(instructions="Sys", temperature=0.5, top_p=0.9, max_output_tokens=32,
                parallel_tool_calls=False, tools=[WEATHER, TIME],
                tool_choice={"type": "function", "name": "get_time"},
                include=["message.output_text.logprobs"], top_logprobs=3),
        conversation({"role": "user", "content": "Q"}),
    )  # fmt: skip
    assert (chat.temperature, chat.top_p, chat.max_completion_tokens) == (0.5, 0.9, 32)
    assert chat.parallel_tool_calls is False and chat.tool_names == ("get_weather", "get_time")
    assert (
        isinstance(chat.tool_choice, NamedToolChoice)
        and chat.tool_choice.function.name == "get_time"
    )
    assert chat.logprobs and chat.top_logprobs == 3
    assert chat.tools is not None and chat.tools[0].function.description == "Weather in a city"


def test_allowed_tools_narrow_the_tools() -> None:
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "get_time"}]}  # fmt: skip
    chat = chat_request(
        request(tools=[WEATHER, TIME], tool_choice=choice),
        conversation({"role": "user", "content": "Q"}),
    )
    assert chat.tool_names == ("get_time",) and chat.tool_choice == "required"


@pytest.mark.parametrize(
    ("text_format", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, "json_object"),
        ({"type": "json_schema", "name": "p", "schema": {"type": "object"}, "strict": True},
         "json_schema"),
    ],
)  # fmt: skip
def test_text_format_becomes_the_response_format(
    text_format: dict[str, Any], expected: str | None
) -> None:
    chat = chat_request(
        request(text={"format": text_format}), conversation({"role": "user", "content": "Q"})
    )
    kind = chat.response_format.type if chat.response_format is not None else None
    assert kind == expected
    if expected == "json_schema":
        assert chat.response_format is not None and chat.response_format.json_schema is not None
        assert chat.response_format.json_schema.schema_ == {"type": "object"}
        assert chat.response_format.json_schema.strict is True


def test_truncation_drops_the_oldest_messages_after_the_instructions() -> None:
    items = conversation(*({"role": "user", "content": str(i)} for i in range(4)))
    chat = chat_request(request(instructions="Sys"), items, num_dropped=2)
    assert [m.text for m in chat.messages] == ["Sys", "2", "3"]


def test_a_conversation_with_nothing_to_read_is_a_400_on_input() -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat_request(request(), conversation({"type": "reasoning", "summary": []}))
    assert caught.value.param == "input" and "nothing the model can read" in caught.value.message
