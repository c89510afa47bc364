"""The streamed event sequence: Anthropic's order, its block indices, and every event valid
for the ``anthropic`` client's own types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from conveyor.endpoints.messages.events import BlockWriter, message_events
from conveyor.endpoints.tool_stream import ArgumentsDelta, CallStart
from conveyor.endpoints.tools import ParsedCall
from conveyor.engine.outputs import FinishReason
from tests.unit.endpoints.messages.fake_run import FakeRun, output

pytestmark = pytest.mark.anyio

EVENTS = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def events_of(run: FakeRun) -> list[dict[str, Any]]:
    events = [event async for event in message_events(run)]  # type: ignore[arg-type]
    for event in events:
        if event["type"] != "ping":
            EVENTS.validate_python(event)
    return events


def blocks_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks the events build, as a client accumulates them."""
    blocks: list[dict[str, Any]] = []
    for event in events:
        if event["type"] == "content_block_start":
            assert event["index"] == len(blocks)
            blocks.append({**event["content_block"], "json": ""})
        elif event["type"] == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                block["json"] += delta["partial_json"]
    return blocks


async def test_a_text_reply_streams_in_anthropic_order() -> None:
    run = FakeRun([output("Hel", 1), output("lo", 2), output("", 3, FinishReason.STOP)])
    events = await events_of(run)
    kinds = [e["type"] for e in events]
    assert kinds == ["message_start", "ping", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]  # fmt: skip
    start = events[0]["message"]
    assert start["id"] == "msg_0123abcd" and start["usage"]["input_tokens"] == 7
    assert blocks_of(events)[0]["text"] == "Hello"
    final = events[-2]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"] == {"output_tokens": 3}


async def test_a_stop_sequence_and_a_cut_reply_are_named() -> None:
    stopped = await events_of(FakeRun([output("ok", 2, FinishReason.STOP, "END")]))
    assert stopped[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    cut = await events_of(FakeRun([output("o", 1), output("k", 2, FinishReason.LENGTH)]))
    assert cut[-2]["delta"]["stop_reason"] == "max_tokens"


async def test_tool_calls_stream_as_tool_use_blocks_with_input_json_deltas() -> None:
    text = ('Let me look.<tool_call>\n{"name": "weather", "arguments": {"city": "Par'
            'is"}}\n</tool_call>\n<tool_call>\n{"name": "weather", "arguments": {"city": '
            '"Rome"}}\n</tool_call>')  # fmt: skip
    pieces = [output(text[i : i + 7], i // 7 + 1) for i in range(0, len(text), 7)]
    pieces.append(output("", len(pieces) + 1, FinishReason.STOP))
    events = await events_of(FakeRun(pieces, tool_names=("weather",)))
    text_block, first, second = blocks_of(events)
    assert text_block["text"] == "Let me look."
    assert [first["name"], second["name"]] == ["weather", "weather"]
    assert json.loads(first["json"]) == {"city": "Paris"}
    assert json.loads(second["json"]) == {"city": "Rome"}
    assert first["id"].startswith("toolu_") and first["id"] != second["id"]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_the_block_writer_closes_each_block_before_the_next() -> None:
    writer = BlockWriter()
    payloads = writer.feed(["a", CallStart("f"), ArgumentsDelta('{"x": 1}'),
                            ParsedCall("g", "{}"), "b"])  # fmt: skip
    payloads += writer.close()
    kinds = [(p["type"], p["index"]) for p in payloads]
    assert kinds == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_delta", 3), ("content_block_stop", 3),
    ]  # fmt: skip
    assert writer.num_calls == 2
    assert writer.close() == []
