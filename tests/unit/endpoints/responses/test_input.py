"""A request's input as stored items: OpenAI's shapes, every item with an id."""

from __future__ import annotations

from typing import Any

from openai.types.responses import ResponseItem
from pydantic import TypeAdapter

from conveyor.endpoints.responses.input import input_items, items_chars
from conveyor.endpoints.responses.schemas import ResponseRequest
from conveyor.endpoints.validation import parse_body

ITEM = TypeAdapter(ResponseItem)


def stored(input_value: Any) -> list[dict[str, Any]]:
    return input_items(parse_body(ResponseRequest, {"model": "m", "input": input_value}))


def test_a_string_is_one_user_message() -> None:
    [item] = stored("Hello")
    assert item["id"].startswith("msg_") and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "Hello"}]


def test_every_kind_is_stored_in_openai_shapes_keeping_given_ids() -> None:
    items = stored([
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "Earlier answer", "id": "msg_given"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "4"}, {"type": "input_text", "text": "2"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
    ])  # fmt: skip
    assert items[1]["id"] == "msg_given"
    assert items[1]["content"] == [
        {"type": "output_text", "text": "Earlier answer", "annotations": []}
    ]
    assert items[2]["content"] == [{"type": "refusal", "refusal": "No."}]
    assert items[3]["id"].startswith("fc_") and items[3]["call_id"] == "c1"
    assert items[4]["output"] == "42" and items[4]["id"].startswith("fco_")
    assert items[5] == {"id": items[5]["id"], "type": "reasoning", "summary": []}
    assert len({item["id"] for item in items}) == len(items)
    for item in items:
        ITEM.validate_python(item)  # as openai-python reads an input item list


def test_stored_items_parse_again_as_input() -> None:
    first = stored([{"role": "user", "content": "q"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])  # fmt: skip
    assert stored(first) == first


def test_items_chars_counts_the_text_of_stored_items() -> None:
    items = stored([{"role": "user", "content": "abcd"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c", "output": "xyz"}])  # fmt: skip
    assert items_chars(items) == 4 + 2 + 3
