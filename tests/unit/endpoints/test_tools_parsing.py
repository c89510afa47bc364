"""Tool calls parsed out of text: whole replies and streamed deltas; embeddings refuse
unknown fields like the generation endpoints."""

from __future__ import annotations

import json

import pytest

from conveyor.endpoints.embeddings import parse_embedding_request
from conveyor.endpoints.tool_stream import (
    ArgumentsDelta,
    CallStart,
    Event,
    ToolCallStream,
    stream_deltas,
)
from conveyor.endpoints.tools import ParsedCall, parse_cut_call, parse_tool_calls
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


def feed_in_pieces(parser: ToolCallStream, text: str, piece_size: int) -> list[Event]:
    """Every event of ``text`` fed ``piece_size`` characters at a time, then finished."""
    events: list[Event] = []
    for start in range(0, len(text), piece_size):
        events += parser.feed(text[start : start + piece_size])
    return events + parser.finish()


def assembled_calls(events: list[Event]) -> list[tuple[str, str]]:
    """(name, arguments) of each call, whole or streamed, as a client would assemble them."""
    calls: list[tuple[str, str]] = []
    for event in events:
        if isinstance(event, ParsedCall | CallStart):
            calls.append((event.name, event.arguments if isinstance(event, ParsedCall) else ""))
        elif isinstance(event, ArgumentsDelta):
            calls[-1] = (calls[-1][0], calls[-1][1] + event.text)
    return calls


@pytest.mark.parametrize("piece_size", [1, 3, 7, 1000])
def test_the_stream_parser_gives_the_same_result_in_any_pieces(piece_size: int) -> None:
    text = f"Hi <tool_ <b>{CALL}\n{CALL} bye"
    parser = ToolCallStream(NAMES)
    events = feed_in_pieces(parser, text, piece_size)
    content = "".join(e for e in events if isinstance(e, str))
    assert content == "Hi <tool_ <b> bye"
    assert assembled_calls(events) == [("get_weather", '{"city": "Paris"}')] * 2
    assert parser.num_calls == 2


def test_arguments_stream_piece_by_piece_as_they_are_written() -> None:
    parser = ToolCallStream(NAMES)
    assert parser.feed('<tool_call>\n{"name": "get_weather", "arguments": ') == []
    assert parser.feed('{"city"') == [CallStart("get_weather"), ArgumentsDelta('{"city"')]
    assert parser.feed(': "Par') == [ArgumentsDelta(': "Par')]
    assert parser.feed('is"}') == [ArgumentsDelta('is"')]  # the `}` may close the block
    assert parser.feed("}\n</tool") == [ArgumentsDelta("}")]
    assert parser.feed("_call>") == []
    assert parser.finish() == []


def test_a_block_that_does_not_open_with_name_then_arguments_is_parsed_whole() -> None:
    text = '<tool_call>{"arguments": {"tz": "UTC"}, "name": "get_time"}</tool_call>'
    events = feed_in_pieces(ToolCallStream(NAMES), text, 1)
    assert events == [ParsedCall("get_time", '{"tz": "UTC"}')]
    unknown = '<tool_call>{"name": "rm", "arguments": {"path": "/"}}</tool_call>'
    assert "".join(map(str, feed_in_pieces(ToolCallStream(NAMES), unknown, 2))) == unknown


def test_a_streamed_call_cut_short_sends_what_it_has() -> None:
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    events = feed_in_pieces(ToolCallStream(NAMES), cut, 4)
    assert assembled_calls(events) == [("get_weather", '{"city": "Par')]
    assert not any(isinstance(e, str) for e in events)


@pytest.mark.parametrize("size", range(len(CALL) + 1))
def test_a_call_cut_anywhere_reads_the_same_whole_and_streamed(size: int) -> None:
    cut = CALL[:size]
    content, calls = parse_tool_calls(cut, NAMES, is_cut=True)
    parser = ToolCallStream(NAMES)
    events = [e for start in range(0, size, 3) for e in parser.feed(cut[start : start + 3])]
    events += parser.finish(is_cut=True)
    assert [(call.name, call.arguments) for call in calls] == assembled_calls(events)
    assert (content or "") == "".join(e for e in events if isinstance(e, str))
    if size >= len('<tool_call>\n{"name": "get_w'):  # a known tool's name is clear from here
        assert content is None and [call.name for call in calls] == ["get_weather"]
        assert '{"city": "Paris"}'.startswith(calls[0].arguments)
    else:
        assert content == (cut or None) and calls == []


def test_a_cut_call_names_only_a_tool_it_can_be() -> None:
    assert parse_cut_call('\n{"name": "get_', NAMES) is None  # either tool
    assert parse_cut_call('\n{"name": "rm", "arguments": {', NAMES) is None
    assert parse_cut_call('\n{"name": "get_t', NAMES) == ParsedCall("get_time", "")
    assert parse_cut_call('\n{"name": "get_time", "argu', NAMES) == ParsedCall("get_time", "")
    whole = '\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_'
    assert parse_cut_call(whole, NAMES) == ParsedCall("get_time", '{"tz": "UTC"}')
    text = f'{CALL}\n<tool_call>\n{{"name": "get_time", "arguments": {{"tz": "U'
    assert parse_tool_calls(text, NAMES) == (text[len(CALL) :].strip(), [ParsedCall(
        "get_weather", '{"city": "Paris"}')])  # fmt: skip
    assert parse_tool_calls(text, NAMES, is_cut=True)[1][1] == ParsedCall("get_time", '{"tz": "U')


def test_deltas_give_each_call_its_index_across_feeds() -> None:
    parser = ToolCallStream(NAMES)
    first = parser.feed(CALL + '<tool_call>{"name": "get_time", "arguments": {"tz"')
    deltas = stream_deltas(first, parser.num_calls)
    later = parser.feed(': "UTC"}}</tool_call>')
    deltas += stream_deltas(later, parser.num_calls)
    pieces = [call for delta in deltas for call in delta["tool_calls"]]
    assert [p["index"] for p in pieces if "id" in p] == [0, 1]
    arguments = {0: "", 1: ""}
    for piece in pieces:
        arguments[piece["index"]] += piece["function"]["arguments"]
    assert arguments == {0: '{"city": "Paris"}', 1: '{"tz": "UTC"}'}


def test_an_unclosed_block_is_streamed_as_text_at_the_end() -> None:
    parser = ToolCallStream(NAMES)
    assert parser.feed("<tool_call>{") == []
    assert parser.finish() == ["<tool_call>{"]


def test_embeddings_refuse_unknown_fields() -> None:
    with pytest.raises(InvalidRequest, match="unrecognized request argument: 'colour'") as caught:
        parse_embedding_request({"model": "m", "input": "a", "colour": "red"})
    assert caught.value.param == "colour"
