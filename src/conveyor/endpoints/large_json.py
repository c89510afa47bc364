"""JSON for a large value, written in pieces so no one call holds the interpreter lock long.

orjson writes tens of megabytes in one call and holds the GIL throughout (a 70 MB answer:
0.2 s in which the event loop cannot run, even with the call on another thread).
:func:`dumps_in_pieces` writes a container item by item, and a long list a slice of
``PIECE_ITEMS`` at a time, so a thread gives the GIL up between pieces. The bytes are the
ones ``orjson.dumps`` writes. A long list's items are taken to be small (in an answer they
are per-token entries); a short list's items are written one by one, however large.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

__all__ = ["PIECE_ITEMS", "dumps_in_pieces"]

PIECE_ITEMS = 256


def dumps_in_pieces(value: Any) -> bytes:
    """``orjson.dumps(value)``, written piece by piece (see the module docstring)."""
    return b"".join(_pieces(value))


def _pieces(value: Any) -> Iterator[bytes]:
    """The JSON of ``value`` as consecutive pieces."""
    if isinstance(value, dict) and value:
        yield from _object_pieces(value)
    elif isinstance(value, list | tuple) and len(value) > PIECE_ITEMS:
        yield from _slices(value)
    elif isinstance(value, list | tuple) and value and isinstance(value[0], dict | list | tuple):
        yield b"["
        for index, item in enumerate(value):
            if index:
                yield b","
            yield from _pieces(item)
        yield b"]"
    else:
        yield orjson.dumps(value)


def _object_pieces(value: dict[str, Any]) -> Iterator[bytes]:
    """An object: each key, then its value's pieces."""
    separator = b"{"
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"JSON object keys must be strings, got {type(key).__name__}")
        yield separator + orjson.dumps(key) + b":"
        yield from _pieces(item)
        separator = b","
    yield b"}"


def _slices(value: list[Any] | tuple[Any, ...]) -> Iterator[bytes]:
    """A long list, ``PIECE_ITEMS`` items per orjson call (their brackets dropped)."""
    yield b"["
    for start in range(0, len(value), PIECE_ITEMS):
        piece = orjson.dumps(value[start : start + PIECE_ITEMS])
        yield (b"," if start else b"") + piece[1:-1]
    yield b"]"
