"""A streamed reply as Anthropic's event sequence.

``message_start`` (the message with no content yet and the input tokens), one ``ping``,
then per content block ``content_block_start``, its ``content_block_delta`` events
(``text_delta`` for text, ``input_json_delta`` for a tool's input as the model writes it)
and ``content_block_stop``; at the end ``message_delta`` (stop reason, stop sequence,
output tokens) and ``message_stop``. Each event is a dict whose ``type`` names it.

``BlockWriter`` is the pure part: it turns the tool-call parser's events into block events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from conveyor.endpoints.generation import GenerationRun
from conveyor.endpoints.messages.reply import (
    message_id,
    new_tool_use_id,
    stop_reason,
    usage_body,
)
from conveyor.endpoints.tool_stream import ArgumentsDelta, CallStart, Event, ToolCallStream
from conveyor.endpoints.tools import ParsedCall
from conveyor.engine.outputs import FinishReason

__all__ = ["BlockWriter", "message_events", "start_event"]

Payload = dict[str, Any]


class BlockWriter:
    """Content block events for the parser's events: text, streamed calls, whole calls."""

    def __init__(self) -> None:
        self._index = -1
        self._open: str | None = None  # the open block's type
        self.num_calls = 0

    def feed(self, events: list[Event]) -> list[Payload]:
        """The block events for ``events``, in order."""
        payloads: list[Payload] = []
        for event in events:
            if isinstance(event, str):
                self._text(payloads, event)
            elif isinstance(event, CallStart):
                self._start_call(payloads, event.name)
            elif isinstance(event, ArgumentsDelta):
                payloads.append(self._delta({"type": "input_json_delta",
                                             "partial_json": event.text}))  # fmt: skip
            elif isinstance(event, ParsedCall):
                self._start_call(payloads, event.name)
                if event.arguments:
                    payloads.append(self._delta({"type": "input_json_delta",
                                                 "partial_json": event.arguments}))  # fmt: skip
                self._close(payloads)
        return payloads

    def close(self) -> list[Payload]:
        """The stop event of the block still open, if any."""
        payloads: list[Payload] = []
        self._close(payloads)
        return payloads

    def _text(self, payloads: list[Payload], text: str) -> None:
        """Text goes to the open text block, or to a new one."""
        if not text:
            return
        if self._open != "text":
            self._open_block(payloads, {"type": "text", "text": ""})
        payloads.append(self._delta({"type": "text_delta", "text": text}))

    def _start_call(self, payloads: list[Payload], name: str) -> None:
        """A new ``tool_use`` block; its input follows as ``input_json_delta`` events."""
        self.num_calls += 1
        block = {"type": "tool_use", "id": new_tool_use_id(), "name": name, "input": {}}
        self._open_block(payloads, block)

    def _open_block(self, payloads: list[Payload], block: Payload) -> None:
        self._close(payloads)
        self._index += 1
        self._open = block["type"]
        payloads.append({"type": "content_block_start", "index": self._index,
                         "content_block": block})  # fmt: skip

    def _close(self, payloads: list[Payload]) -> None:
        if self._open is not None:
            payloads.append({"type": "content_block_stop", "index": self._index})
            self._open = None

    def _delta(self, delta: Payload) -> Payload:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}


def start_event(run: GenerationRun) -> Payload:
    """``message_start``: the message with no content yet and its input tokens."""
    message: Payload = {
        "id": message_id(run), "type": "message", "role": "assistant", "model": run.model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": usage_body(run.total_prompt_tokens, 0),
    }  # fmt: skip
    return {"type": "message_start", "message": message}


async def message_events(run: GenerationRun, **_: Any) -> AsyncIterator[Payload]:
    """Every event of the run's reply, ``message_start`` to ``message_stop`` (one choice).

    Takes (and ignores) the keyword arguments the chat streams take (``include_usage``).
    """
    yield start_event(run)
    yield {"type": "ping"}
    parser = ToolCallStream(run.tool_names)
    writer = BlockWriter()
    async for output in run.outputs():
        events: list[Event] = parser.feed(output.text) if run.tool_names else [output.text]
        if output.finish_reason is None:
            for payload in writer.feed(events):
                yield payload
            continue
        is_cut = output.finish_reason is FinishReason.LENGTH
        if run.tool_names:
            events += parser.finish(is_cut=is_cut)
        for payload in [*writer.feed(events), *writer.close()]:
            yield payload
        reason = stop_reason(output.finish_reason.value, output.stop_string, writer.num_calls)
        delta = {"stop_reason": reason, "stop_sequence": output.stop_string}
        usage = {"output_tokens": output.num_output_tokens}
        yield {"type": "message_delta", "delta": delta, "usage": usage}
    yield {"type": "message_stop"}
