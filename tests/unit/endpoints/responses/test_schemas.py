"""The Responses request body: what it takes, what it refuses by name, and its defaults."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.endpoints.responses.item_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
)
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body
from conveyor.errors import InvalidRequest

FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def parse(**fields: Any) -> ResponseRequest:
    return parse_body(ResponseRequest, {"model": "m", "input": "hi", **fields})


def refused(**fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse(**fields)
    return caught.value


def test_a_string_input_and_the_defaults() -> None:
    request = parse()
    assert request.input == "hi"
    assert request.is_stored and not request.wants_logprobs and request.tool_names == ()


def test_items_of_each_kind_parse_with_a_message_type_optional() -> None:
    request = parse(input=[
        {"role": "user", "content": "What is the weather?"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1",
         "status": "completed", "namespace": "ignored"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
    ])  # fmt: skip
    kinds = [type(item) for item in request.input]
    assert kinds == [MessageItem, MessageItem, MessageItem, FunctionCallItem,
                     FunctionCallOutputItem, ReasoningItem]  # fmt: skip


@pytest.mark.parametrize(
    "hosted", ["web_search", "file_search", "code_interpreter", "computer_use_preview",
               "image_generation", "mcp", "local_shell"],
)  # fmt: skip
def test_a_hosted_tool_is_a_400_naming_it(hosted: str) -> None:
    error = refused(tools=[FUNCTION, {"type": hosted}])
    assert error.param == "tools" and repr(hosted) in error.message and "tools[1]" in error.message


def test_items_conveyor_cannot_take_are_refused_by_type() -> None:
    error = refused(input=[{"type": "web_search_call", "id": "ws_1"}])
    assert error.param == "input" and "'web_search_call'" in error.message
    assert "item references" in refused(input=[{"type": "item_reference", "id": "x"}]).message
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}
    assert "'input_image'" in refused(input=[image]).message


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"conversation": "conv_1"}, "previous_response_id"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt templates"),
        ({"background": True, "stream": True}, "not streamed"),
        ({"background": True, "store": False}, "must be stored"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "nope"}}, "'nope'"),
        ({"tools": [FUNCTION], "tool_choice": {"type": "web_search_preview"}}, "web_search"),
        ({"tools": [FUNCTION, FUNCTION]}, "unique"),
        ({"max_output_tokens": 15}, "16"),
        ({"input": []}, "empty"),
        ({"seed": 1}, "unrecognized"),
        ({"metadata": {"k": 1}}, "strings"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "16 pairs"),
    ],
)
def test_bad_bodies_are_a_400_saying_why(fields: dict[str, Any], words: str) -> None:
    assert words in refused(**fields).message


def test_ignored_fields_are_accepted() -> None:
    request = parse(
        reasoning={"effort": "high", "summary": "auto"}, service_tier="auto", user="u",
        prompt_cache_key="k", safety_identifier="s", max_tool_calls=3,
        stream_options={"include_obfuscation": False}, text={"verbosity": "low"},
        client_metadata={"turn_id": "t1"},
        include=["reasoning.encrypted_content", "message.output_text.logprobs"],
    )  # fmt: skip
    assert request.wants_logprobs and request.reasoning == {"effort": "high", "summary": "auto"}


def test_allowed_tools_must_name_known_functions() -> None:
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "get_weather"}]}  # fmt: skip
    assert parse(tools=[FUNCTION], tool_choice=choice).tool_choice is not None
    wrong = {**choice, "tools": [{"type": "function", "name": "other"}]}
    assert "'other'" in refused(tools=[FUNCTION], tool_choice=wrong).message
    hosted = {**choice, "tools": [{"type": "web_search"}]}
    assert "only list functions" in refused(tools=[FUNCTION], tool_choice=hosted).message


def test_a_json_schema_format_needs_its_name_and_schema() -> None:
    text = {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}}
    assert parse(text=text).text is not None
    assert "'name' and 'schema'" in refused(text={"format": {"type": "json_schema"}}).message


def test_a_json_format_or_a_forced_call_means_a_grammar() -> None:
    schema = {"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}}
    allowed = {"type": "allowed_tools", "tools": [{"type": "function", "name": "get_weather"}]}
    assert not parse().has_grammar and not parse(text={"format": {"type": "text"}}).has_grammar
    assert (
        parse(text=schema).has_grammar
        and parse(text={"format": {"type": "json_object"}}).has_grammar
    )
    assert parse(tools=[FUNCTION], tool_choice="required").has_grammar
    assert parse(
        tools=[FUNCTION], tool_choice={"type": "function", "name": "get_weather"}
    ).has_grammar
    assert parse(tools=[FUNCTION], tool_choice={**allowed, "mode": "required"}).has_grammar
    assert not parse(tools=[FUNCTION], tool_choice={**allowed, "mode": "auto"}).has_grammar
    assert not parse(tools=[FUNCTION], tool_choice="auto").has_grammar


def test_input_bytes_count_instructions_messages_and_calls() -> None:
    items = [{"role": "user", "content": "abcd"},
             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "xyz"}]  # fmt: skip
    assert parse(input=items, instructions="12345").input_bytes() == 5 + 4 + 2 + 3
    assert parse(input="abc").input_bytes() == 3
