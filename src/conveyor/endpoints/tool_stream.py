"""Tool calls in a streamed reply: content passes through, ``<tool_call>`` blocks become calls.

Text that may be the start of a block is held back until it is clear, so a call's
markup is never streamed as content. A block that is not a valid call to a known tool
is streamed as the content it was.
"""

from __future__ import annotations

from conveyor.endpoints.tools import CALL_END, CALL_START, ParsedCall, parse_call_block

__all__ = ["ToolCallStream"]

Event = str | ParsedCall


class ToolCallStream:
    """Feed text deltas; get content strings and parsed calls, in order."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self._buffer = ""
        self._is_in_call = False
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
                self._add(events, self._call_or_text(before))
            else:
                self._add(events, before)
            self._is_in_call = not self._is_in_call
        if not self._is_in_call:
            keep = _partial_marker_len(self._buffer)
            cut = len(self._buffer) - keep
            self._add(events, self._buffer[:cut])
            self._buffer = self._buffer[cut:]
        return events

    def finish(self) -> list[Event]:
        """Whatever is still held back, as content (an unclosed block stays text)."""
        rest = (CALL_START if self._is_in_call else "") + self._buffer
        self._buffer, self._is_in_call = "", False
        events: list[Event] = []
        self._add(events, rest)
        self._blank = ""  # trailing blanks after the calls are dropped
        return events

    def _call_or_text(self, body: str) -> Event:
        """The block's call, or its text unchanged."""
        call = parse_call_block(body, self._names)
        return call if call is not None else f"{CALL_START}{body}{CALL_END}"

    def _add(self, events: list[Event], event: Event) -> None:
        """Keep an event; blank text after a call waits for content (dropped before a call)."""
        if isinstance(event, ParsedCall):
            self.num_calls += 1
            self._blank = ""
            events.append(event)
        elif self.num_calls and not event.strip():
            self._blank += event
        elif event:
            events.append(self._blank + event)
            self._blank = ""


def _partial_marker_len(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of the start marker."""
    for size in range(min(len(CALL_START) - 1, len(text)), 0, -1):
        if text.endswith(CALL_START[:size]):
            return size
    return 0
