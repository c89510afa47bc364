"""Tool calls parsed out of text: whole replies and streamed deltas; embeddings refuse
unknown fields like the generation endpoints."""

from __future__ import annotations

import json

import pytest

from conveyor.endpoints.embeddings import parse_embedding_request
from conveyor.endpoints.tool_stream import ToolCallStream
from conveyor.endpoints.tools import ParsedCall, parse_tool_calls
from conveyor.errors import InvalidRequest

NAMES = ("get_weather", "get_time")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_calls_are_split_from_content() -> None:
    content, calls = parse_tool_calls(f"Let me check.\n{CALL}\n{CALL}", NAMES)
    assert content == "Let me check."
    assert calls == [ParsedCall("get_weather", json.dumps({"city": "Paris"}))] * 2


def test_a_block_naming_no_tool_or_not_json_stays_content() -> None:
    text = '<tool_call>{"name": "rm", "arguments": {}}</tool_call> and <tool_call>{oops</tool_call>'
    assert parse_tool_calls(text, NAMES) == (text, [])
    assert parse_tool_calls("", NAMES) == (None, [])


@pytest.mark.parametrize("piece_size", [1, 3, 7, 1000])
def test_the_stream_parser_gives_the_same_result_in_any_pieces(piece_size: int) -> None:
    text = f"Hi <tool_ <b>{CALL}\n{CALL} bye"
    parser = ToolCallStream(NAMES)
    events = []
    for start in range(0, len(text), piece_size):
        events += parser.feed(text[start : start + piece_size])
    events += parser.finish()
    content = "".join(e for e in events if isinstance(e, str))
    assert content == "Hi <tool_ <b> bye"
    assert [e.name for e in events if isinstance(e, ParsedCall)] == ["get_weather"] * 2
    assert parser.num_calls == 2


def test_an_unclosed_block_is_streamed_as_text_at_the_end() -> None:
    parser = ToolCallStream(NAMES)
    assert parser.feed("<tool_call>{") == []
    assert parser.finish() == ["<tool_call>{"]


def test_embeddings_refuse_unknown_fields() -> None:
    with pytest.raises(InvalidRequest, match="unrecognized request argument: 'colour'") as caught:
        parse_embedding_request({"model": "m", "input": "a", "colour": "red"})
    assert caught.value.param == "colour"
