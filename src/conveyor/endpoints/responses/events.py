"""A response's output items and stream events, built from the model's text as it comes.

One builder serves a streamed and a whole response alike, so both carry the same items:
text becomes a ``message`` item with one ``output_text`` part, and each ``<tool_call>``
block the chat path's parser finds (``tool_stream``) a ``function_call`` item with its
own ``call_id``. The events follow OpenAI's order, numbered by ``sequence_number``::

    response.created, response.in_progress,
    per message: output_item.added, content_part.added, output_text.delta...,
                 output_text.done, content_part.done, output_item.done
    per call:    output_item.added, function_call_arguments.delta...,
                 function_call_arguments.done, output_item.done
    response.completed | response.incomplete (cut by max_output_tokens) | response.failed

Every event is a fresh dict: a builder's later changes never reach one already sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.endpoints.responses.input import new_item_id
from conveyor.endpoints.responses.output import response_object
from conveyor.endpoints.tool_stream import ArgumentsDelta, CallStart, Event, ToolCallStream
from conveyor.endpoints.tools import ParsedCall, new_call_id

__all__ = ["ResponseBuilder"]


@dataclass(slots=True)
class _OpenItem:
    """The item being written: a message's text or a call's arguments so far."""

    index: int
    id: str
    name: str | None = None  # a call's function; None for a message
    call_id: str = ""
    text: str = ""
    logprobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_call(self) -> bool:
        """Whether the item is a function call."""
        return self.name is not None

    def render(self, status: str) -> dict[str, Any]:
        """The item as the API shows it."""
        if self.name is not None:
            return {
                "id": self.id, "type": "function_call", "call_id": self.call_id,
                "name": self.name, "arguments": self.text, "status": status,
            }  # fmt: skip
        content = [self.part()] if status != "in_progress" else []
        return {"id": self.id, "type": "message", "role": "assistant", "status": status,
                "content": content}  # fmt: skip

    def part(self) -> dict[str, Any]:
        """A message's ``output_text`` part as far as it got."""
        return {"type": "output_text", "text": self.text, "annotations": [],
                "logprobs": list(self.logprobs)}  # fmt: skip


class ResponseBuilder:
    """Feeds text in, gets events out; ``response`` is the Response object so far."""

    def __init__(self, base: dict[str, Any], tool_names: tuple[str, ...]) -> None:
        """``base`` is the response's envelope; calls to ``tool_names`` are parsed out."""
        self._base = base
        self._parser = ToolCallStream(tool_names) if tool_names else None
        self._done: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None
        self._pending_logprobs: list[dict[str, Any]] = []
        self._sequence = 0
        self.response = response_object(base, status="in_progress", output=[])

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    def feed(self, text: str, logprobs: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """The events ``text`` (the next piece of output) releases; ``logprobs`` are its
        tokens' entries, sent with the next text delta."""
        self._pending_logprobs.extend(logprobs)
        pieces: list[Event] = self._parser.feed(text) if self._parser else [text]
        return self._apply(pieces)

    def finish(self, *, is_cut: bool, usage: dict[str, Any], now: int) -> list[dict[str, Any]]:
        """Close the output and end with ``response.completed`` or, when ``max_output_tokens``
        cut it (``is_cut``), ``response.incomplete``."""
        status = "incomplete" if is_cut else "completed"
        events = self._apply(self._parser.finish(is_cut=is_cut), status) if self._parser else []
        if not self._done and self._open is None:
            events += self._open_message()  # an empty answer is one empty message
        events += self._close(status)
        self.response = response_object(
            self._base, status=status, output=list(self._done), usage=usage, completed_at=now
        )
        events.append(self._event(f"response.{status}", response=self.response))
        return events

    def fail(self, error: dict[str, Any], usage: dict[str, Any] | None) -> list[dict[str, Any]]:
        """End with ``response.failed`` carrying ``error`` (the output so far is kept)."""
        events = self._close("incomplete")
        self.response = response_object(
            self._base, status="failed", output=list(self._done), usage=usage, error=error
        )
        events.append(self._event("response.failed", response=self.response))
        return events

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """The next event of the stream."""
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _apply(
        self, pieces: Iterable[Event], call_status: str = "completed"
    ) -> list[dict[str, Any]]:
        """Events for the parser's output: text, whole calls and streamed calls; a whole
        call ends with ``call_status`` (``incomplete``: the output was cut inside it)."""
        events: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, str):
                events += self._add_text(piece)
            elif isinstance(piece, ArgumentsDelta):
                events += self._add_arguments(piece.text)
            elif isinstance(piece, CallStart):
                events += [*self._close("completed"), *self._open_call(piece.name)]
            elif isinstance(piece, ParsedCall):
                events += [*self._close("completed"), *self._open_call(piece.name)]
                events += [*self._add_arguments(piece.arguments), *self._close(call_status)]
        return events

    def _add_text(self, text: str) -> list[dict[str, Any]]:
        """A text delta, opening a message first when none is open."""
        if not text:
            return []
        events = []
        if self._open is None or self._open.is_call:
            events += [*self._close("completed"), *self._open_message()]
        item = self._open
        if item is None:
            raise RuntimeError("no message is open")
        item.text += text
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        item.logprobs += logprobs
        events.append(self._event(
            "response.output_text.delta", item_id=item.id, output_index=item.index,
            content_index=0, delta=text, logprobs=logprobs,
        ))  # fmt: skip
        return events

    def _add_arguments(self, text: str) -> list[dict[str, Any]]:
        """More of the open call's arguments."""
        item = self._open
        if item is None or not item.is_call or not text:
            return []
        item.text += text
        return [self._event("response.function_call_arguments.delta", item_id=item.id,
                            output_index=item.index, delta=text)]  # fmt: skip

    def _open_message(self) -> list[dict[str, Any]]:
        """Start a message item and its text part."""
        item = self._open = _OpenItem(len(self._done), new_item_id("msg"))
        return [
            self._event("response.output_item.added", output_index=item.index,
                        item=item.render("in_progress")),
            self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                        content_index=0, part=item.part()),
        ]  # fmt: skip

    def _open_call(self, name: str) -> list[dict[str, Any]]:
        """Start a function call item."""
        item = _OpenItem(len(self._done), new_item_id("fc"), name=name, call_id=new_call_id())
        self._open = item
        return [self._event("response.output_item.added", output_index=item.index,
                            item=item.render("in_progress"))]  # fmt: skip

    def _close(self, status: str) -> list[dict[str, Any]]:
        """Finish the open item, if any, with ``status``."""
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index}
        if item.is_call:
            events = [self._event("response.function_call_arguments.done", **where,
                                  arguments=item.text)]  # fmt: skip
        else:
            events = [
                self._event("response.output_text.done", **where, content_index=0,
                            text=item.text, logprobs=list(item.logprobs)),
                self._event("response.content_part.done", **where, content_index=0,
                            part=item.part()),
            ]  # fmt: skip
        rendered = item.render(status)
        self._done.append(rendered)
        events.append(self._event("response.output_item.done", output_index=item.index,
                                  item=dict(rendered)))  # fmt: skip
        return events
