"""The ``message`` object of a finished reply and its stop reason, valid for the
``anthropic`` client's ``Message`` type."""

from __future__ import annotations

import pytest
from anthropic.types import Message

from conveyor.endpoints.generation import ChoiceResult
from conveyor.endpoints.messages.reply import message_body, stop_reason, tool_input
from tests.unit.endpoints.messages.fake_run import FakeRun


@pytest.mark.parametrize(
    ("finish", "stop", "num_calls", "expected"),
    [
        ("stop", None, 0, "end_turn"),
        ("stop", "END", 0, "stop_sequence"),
        ("stop", None, 2, "tool_use"),
        ("length", None, 1, "max_tokens"),
        ("length", None, 0, "max_tokens"),
    ],
)
def test_stop_reasons(finish: str, stop: str | None, num_calls: int, expected: str) -> None:
    assert stop_reason(finish, stop, num_calls) == expected


def test_a_reply_with_a_call_has_text_then_tool_use_blocks() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    result = ChoiceResult(0, text=text, finish_reason="stop", num_output_tokens=12)
    body = message_body(FakeRun([], tool_names=("weather",)), [result])  # type: ignore[arg-type]
    message = Message.model_validate(body)
    assert message.id == "msg_0123abcd" and message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use"]
    call = message.content[1]
    assert call.type == "tool_use" and call.input == {"city": "Oslo"}
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 12)


def test_a_stopped_reply_names_its_stop_sequence() -> None:
    result = ChoiceResult(0, text="one two", finish_reason="stop", num_output_tokens=3,
                          stop_string="three")  # fmt: skip
    message = Message.model_validate(message_body(FakeRun([]), [result]))  # type: ignore[arg-type]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "three")
    empty = ChoiceResult(0, text="", finish_reason="length", num_output_tokens=1)
    assert message_body(FakeRun([]), [empty])["content"] == []  # type: ignore[arg-type]


def test_a_cut_call_keeps_the_input_it_got_to() -> None:
    assert tool_input('{"city": "Pa') == {"city": "Pa"}
    assert tool_input("") == {}
    assert tool_input("[1, 2]") == {}
    assert tool_input("not json") == {}
