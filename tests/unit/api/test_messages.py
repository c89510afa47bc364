"""Anthropic's server-sent events: each named by its payload's type, and an error mid-stream
as Anthropic's ``error`` event."""

from __future__ import annotations

import json

from conveyor.api.messages import ANTHROPIC_EVENTS, encode_named
from conveyor.errors import ModelFault, QueueFull


def test_an_event_is_named_by_its_type() -> None:
    event = encode_named({"type": "message_stop"})
    assert event == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    assert ANTHROPIC_EVENTS.end == b""  # no [DONE]: message_stop ends the stream


def test_an_error_mid_stream_is_an_error_event_in_anthropics_shape() -> None:
    for error, kind in ((ModelFault("the model failed"), "api_error"),
                        (QueueFull("busy", retry_after_s=1), "rate_limit_error")):  # fmt: skip
        (event,) = ANTHROPIC_EVENTS.error(error)
        name, data = event.decode().strip().split("\n")
        assert name == "event: error"
        assert json.loads(data.removeprefix("data: ")) == {
            "type": "error", "error": {"type": kind, "message": error.message},
        }  # fmt: skip
