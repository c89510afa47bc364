"""A gateway settles Anthropic's answers' rate-limit reservations from their usage
(``input_tokens``, ``output_tokens``), whole or streamed, as it does OpenAI's."""

from __future__ import annotations

from conveyor.gateway.limits import StreamMeter, read_usage


def test_anthropic_usage_settles_a_whole_answer_and_a_stream() -> None:
    whole = b'{"type":"message","usage":{"input_tokens":12,"cache_read_input_tokens":3,"output_tokens":5}}'
    assert read_usage(whole) == (12, 5)
    meter = StreamMeter()
    meter.on_message({"type": "http.response.start", "status": 200})
    for event in (
        b'event: message_start\ndata: {"message":{"usage":{"input_tokens":12,"output_tokens":0}}}\n\n',
        b'event: content_block_delta\ndata: {"delta":{"text":"hi"}}\n\n',
        b'event: message_delta\ndata: {"delta":{},"usage":{"output_tokens":7}}\n\n',
    ):
        meter.on_message({"type": "http.response.body", "body": event, "more_body": True})
    assert meter.usage == (12, 7)
    assert read_usage(b'{"usage":{"output_tokens":7}}') is None  # no input figure: not usage
