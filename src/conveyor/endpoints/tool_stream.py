"""Tool calls in a streamed reply: content passes through, ``<tool_call>`` blocks become calls.

Text that may be the start of a block is held back until it is clear, so a call's
markup is never streamed as content. A block that opens as ``{"name": "<a tool>",
"arguments": {`` is a call from then on: its header goes out at once and its arguments
follow as the model writes them (OpenAI streams them in pieces too), holding back only
what may be the block's closing ``}`` and markup. Any other block is parsed whole when it
closes; if it is not a valid call to a known tool it is streamed as the content it was.
A block still open when ``max_tokens`` cut the reply is a call as far as it got, as the
whole reply's parse has it (``parse_cut_call``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from conveyor.endpoints.tools import (
    CALL_END,
    CALL_START,
    ParsedCall,
    held_from,
    new_call_id,
    parse_call_block,
    parse_cut_call,
)

__all__ = ["ArgumentsDelta", "CallStart", "Event", "ToolCallStream", "stream_deltas"]

# A block's opening up to its arguments object: `{"name": "...", "arguments": ` before `{`.
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*(?=\{)')


@dataclass(frozen=True, slots=True)
class CallStart:
    """A call's header: its function's name (its arguments follow as ``ArgumentsDelta``)."""

    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    """More of the latest call's arguments, JSON text as the model writes it."""

    text: str


Event = str | ParsedCall | CallStart | ArgumentsDelta


class ToolCallStream:
    """Feed text deltas; get content strings and calls (whole or streamed), in order."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self._buffer = ""
        self._is_in_call = False
        # The open block's streamed call: where its arguments start and how much went out.
        self._args_start: int | None = None
        self._num_args_sent = 0
        # Blank text after a call, kept until it is clear whether more content follows.
        self._blank = ""
        self.num_calls = 0

    def feed(self, text: str) -> list[Event]:
        """What ``text`` (with what was held back) releases now."""
        self._buffer += text
        events: list[Event] = []
        while True:
            marker = CALL_END if self._is_in_call else CALL_START
            index = self._buffer.find(marker)
            if index < 0:
                break
            before, self._buffer = self._buffer[:index], self._buffer[index + len(marker) :]
            if self._is_in_call:
                self._close_call(events, before)
            else:
                self._add(events, before)
            self._is_in_call = not self._is_in_call
        if self._is_in_call:
            self._stream_call(events, self._buffer[: held_from(self._buffer, CALL_END)])
        else:
            cut = held_from(self._buffer, CALL_START)
            self._add(events, self._buffer[:cut])
            self._buffer = self._buffer[cut:]
        return events

    def finish(self, *, is_cut: bool = False) -> list[Event]:
        """Whatever is still held back: a streamed call's last arguments, else content.

        ``is_cut``: the reply hit ``max_tokens``, so an open block is a call cut short.
        """
        events: list[Event] = []
        if self._is_in_call and is_cut:
            self._cut_call(events, self._buffer)
        elif self._is_in_call and self._args_start is not None:
            self._close_call(events, self._buffer)
        else:
            self._add(events, (CALL_START if self._is_in_call else "") + self._buffer)
        self._buffer, self._is_in_call = "", False
        self._blank = ""  # trailing blanks after the calls are dropped
        return events

    def _stream_call(self, events: list[Event], body: str) -> None:
        """Start streaming the open block as a call once its header shows, then send on."""
        if self._args_start is None:
            match = _HEADER.match(body)
            if match is None or match.group(1) not in self._names:
                return
            self._args_start = match.end()
            self._add(events, CallStart(match.group(1)))
        self._send_arguments(events, _without_closing(body[self._args_start :]))

    def _close_call(self, events: list[Event], body: str) -> None:
        """The block closed: the rest of a streamed call, or the whole block's call or text."""
        if self._args_start is None:
            self._stream_call(events, body)
        if self._args_start is None:
            call = parse_call_block(body, self._names)
            self._add(events, call if call is not None else f"{CALL_START}{body}{CALL_END}")
            return
        self._send_arguments(events, _without_closing(body[self._args_start :]))
        self._args_start, self._num_args_sent = None, 0

    def _cut_call(self, events: list[Event], body: str) -> None:
        """The open block at a cut: the call as far as it got, else the text it was."""
        if self._args_start is None:
            call = parse_cut_call(body, self._names)
            self._add(events, call if call is not None else f"{CALL_START}{body}")
            return
        body = body[: held_from(body, CALL_END)]  # the closing markup may have begun
        arguments = body[self._args_start :]
        if parse_call_block(body, self._names) is not None:  # whole, only the markup cut
            arguments = _without_closing(arguments)
        self._send_arguments(events, arguments)
        self._args_start, self._num_args_sent = None, 0

    def _send_arguments(self, events: list[Event], arguments: str) -> None:
        """Send the part of ``arguments`` (all known so far) not sent yet."""
        if len(arguments) > self._num_args_sent:
            events.append(ArgumentsDelta(arguments[self._num_args_sent :]))
            self._num_args_sent = len(arguments)

    def _add(self, events: list[Event], event: Event) -> None:
        """Keep an event; blank text after a call waits for content (dropped before a call)."""
        if isinstance(event, ParsedCall | CallStart):
            self.num_calls += 1
            self._blank = ""
            events.append(event)
        elif isinstance(event, ArgumentsDelta):
            events.append(event)
        elif self.num_calls and not event.strip():
            self._blank += event
        elif event:
            events.append(self._blank + event)
            self._blank = ""


def stream_deltas(events: list[Event], num_calls: int) -> list[dict[str, Any]]:
    """Chunk deltas for ``events``; ``num_calls`` is the parser's count after them.

    A whole call is its header, then its arguments; a streamed call's pieces go to it.
    """
    position = num_calls - sum(isinstance(e, ParsedCall | CallStart) for e in events)
    deltas: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, str):
            if event:
                deltas.append({"content": event})
        elif isinstance(event, ArgumentsDelta):
            deltas.append(_arguments_delta(position - 1, event.text))
        else:
            header = {"name": event.name, "arguments": ""}
            call = {"index": position, "id": new_call_id(), "type": "function"}
            deltas.append({"tool_calls": [{**call, "function": header}]})
            if isinstance(event, ParsedCall):
                deltas.append(_arguments_delta(position, event.arguments))
            position += 1
    return deltas


def _arguments_delta(position: int, text: str) -> dict[str, Any]:
    """A delta adding ``text`` to the arguments of call ``position``."""
    return {"tool_calls": [{"index": position, "function": {"arguments": text}}]}


def _without_closing(arguments: str) -> str:
    """Arguments text without what may close the call's object: a last `}`, blanks around it.

    What is held back only ever grows into more arguments, so what went out stays a prefix.
    """
    text = arguments.rstrip()
    if text.endswith("}"):
        text = text[:-1].rstrip()
    return text
