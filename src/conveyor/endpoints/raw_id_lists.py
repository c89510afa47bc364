"""Token-id lists counted in a raw JSON body, before it is parsed.

Parsing a JSON array of millions of token ids makes millions of Python ints in one call
that holds the interpreter lock (2M ids: half a second or more), so the event loop stalls
for all of it even though the parse runs on another thread. A prompt of ids longer than
the model's context is refused whatever else the body holds: ``count_id_lists`` finds the
id lists a top-level field holds and counts them by their separators, at C speed, so such
a body can be refused without making one int.

Only what the bytes alone tell is counted: a field holding an array of integers, or an
array of such arrays. The field is found by its name, and proven to be the top-level one
by parsing the body with each candidate list replaced by a random number (a small parse:
the lists are left out); that number is the field's value only if the list was. Any other
shape, or a body that does not parse, is left to the ordinary parse. A list is counted by
its commas, so a malformed one (``[1,,2]``) counts as if it were well formed: a body
refused for its length would be refused as invalid JSON otherwise.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["MAX_COUNTED_LISTS", "WINDOW_BYTES", "CountedIdLists", "count_id_lists"]

# An array of more lists than this is left to the ordinary parse (OpenAI takes 2,048).
MAX_COUNTED_LISTS = 2048
# Occurrences of the field's name looked at (a name may also appear in nested objects).
MAX_CANDIDATES = 8
# Bytes of a list read in one call (a millisecond or so with the interpreter lock held).
WINDOW_BYTES = 1 << 20
# What an array of integers holds between its brackets.
_INT_LIST_BYTES = b"0123456789-, \t\r\n"
_KEY_END = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\[[ \t\r\n]*")
_LIST_START = re.compile(rb"[ \t\r\n]*\[")
_AFTER_LIST = re.compile(rb"[ \t\r\n]*([,\]])")


@dataclass(frozen=True, slots=True)
class CountedIdLists:
    """A body's other top-level fields (parsed) and the ids in each list of the field."""

    fields: dict[str, Any]
    sizes: list[int]


@dataclass(frozen=True, slots=True)
class _Span:
    """Where a candidate value lies in the body, and the ids of each list it holds."""

    start: int
    end: int
    sizes: list[int]


def count_id_lists(raw: bytes, key: str) -> CountedIdLists | None:
    """The id counts of top-level field ``key`` if it holds an array of integers (one
    count) or an array of such arrays (one each), with the other fields; None otherwise."""
    spans = _candidates(raw, b'"' + key.encode() + b'"')
    if not spans:
        return None
    markers = [secrets.randbits(62) for _ in spans]
    pieces, last = [], 0
    for span, marker in zip(spans, markers, strict=True):
        pieces += [raw[last : span.start], b"%d" % marker]
        last = span.end
    pieces.append(raw[last:])
    try:
        fields = orjson.loads(b"".join(pieces))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(fields, dict):
        return None
    value = fields.pop(key, None)
    for span, marker in zip(spans, markers, strict=True):
        if type(value) is int and value == marker:
            return CountedIdLists(fields, span.sizes)
    return None


def _candidates(raw: bytes, needle: bytes) -> list[_Span]:
    """The values after ``"key":`` that are id lists, in order (at most MAX_CANDIDATES)."""
    spans: list[_Span] = []
    position = 0
    for _ in range(MAX_CANDIDATES):
        found = raw.find(needle, position)
        if found < 0:
            break
        position = found + len(needle)
        if _is_escaped(raw, found):
            continue  # a quote inside a string: "a\"key"
        span = _value_at(raw, position)
        if span is not None:
            spans.append(span)
            position = span.end
    return spans


def _is_escaped(raw: bytes, quote: int) -> bool:
    """Whether the quote at ``quote`` is escaped (an odd run of backslashes before it)."""
    run = 0
    while quote - run > 0 and raw[quote - run - 1] == ord("\\"):
        run += 1
    return run % 2 == 1


def _value_at(raw: bytes, position: int) -> _Span | None:
    """The id list (or list of id lists) after a field name at ``position``, if it is one."""
    head = _KEY_END.match(raw, position)
    if head is None:
        return None
    start = raw.rindex(b"[", position, head.end())
    if raw[head.end() : head.end() + 1] == b"[":
        return _nested_at(raw, start)
    end = raw.find(b"]", head.end())
    size = _count_ints(raw, head.end(), end)
    return None if size is None else _Span(start, end + 1, [size])


def _nested_at(raw: bytes, start: int) -> _Span | None:
    """The id lists of the array of arrays opening at ``start``, if that is what it holds."""
    sizes: list[int] = []
    position = start + 1
    while len(sizes) < MAX_COUNTED_LISTS:
        opening = _LIST_START.match(raw, position)
        if opening is None:
            return None
        end = raw.find(b"]", opening.end())
        size = _count_ints(raw, opening.end(), end)
        after = _AFTER_LIST.match(raw, end + 1) if size is not None else None
        if size is None or after is None:
            return None
        sizes.append(size)
        position = after.end()
        if after.group(1) == b"]":
            return _Span(start, position, sizes)
    return None


def _count_ints(raw: bytes, start: int, end: int) -> int | None:
    """The integers between ``start`` and ``end`` (a list's inside), by their commas; None
    if anything else is there (strings, floats, objects) or the list is not closed.

    Read a window at a time: each call holds the interpreter lock for about a millisecond.
    """
    if end < 0:
        return None
    num_commas, is_blank = 0, True
    for offset in range(start, end, WINDOW_BYTES):
        window = raw[offset : min(end, offset + WINDOW_BYTES)]
        if window.translate(None, _INT_LIST_BYTES):
            return None
        num_commas += window.count(b",")
        is_blank = is_blank and window.isspace()
    return 0 if is_blank else num_commas + 1
