"""What the gateway reads from a request body: its ``model`` and how many inputs it carries.

A body with no ``input`` (chat, completions: long prompts) is scanned for its top-level
``model`` string without being parsed; anything the scan is unsure of is parsed. The
gateway reads only what routing needs and forwards the bytes as they came; the worker
validates the body either way.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from conveyor.errors import InvalidRequest

_MODEL_KEY = b'"model"'
_INPUT_KEY = b'"input"'
_OPENING_BRACE = re.compile(rb"\s*\{")
# After the key: the colon and a plain string (no escapes, no control characters).
_MODEL_VALUE = re.compile(rb'\s*:\s*"([^"\\\x00-\x1f]+)"')


def parse_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object (400 if it is not one)."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return parsed


def model_and_inputs(body: dict[str, Any]) -> tuple[str, int]:
    """A parsed body's ``model`` and how many inputs it carries (for the arrival rate)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    inputs = body.get("input")
    # A list of strings or of token lists is one input each; anything else counts once (a
    # Responses conversation's items, say: objects, one request).
    is_many = isinstance(inputs, list) and inputs and not isinstance(inputs[0], int | dict)
    return model, len(inputs) if is_many and isinstance(inputs, list) else 1


def parse_model(body: bytes) -> tuple[str, int]:
    """The request's ``model`` and how many inputs it carries (for the arrival rate)."""
    return model_and_inputs(parse_object(body))


def scan_model(body: bytes) -> str | None:
    """The top-level ``model`` string found by a byte scan, or None when in any doubt.

    It is sure when ``"model"`` occurs exactly once, not after a backslash (so it does not
    end a string), followed by a colon (so it is a key) and an escape-free string, and the
    key is at the top level: it is the only ``{`` opened before it, or the only ``}`` after
    it closes the body. Anything else (escapes, nesting, repeats, braces inside strings)
    returns None and the caller parses the body.
    """
    at = body.find(_MODEL_KEY)
    if at <= 0 or body.find(_MODEL_KEY, at + 1) >= 0 or body[at - 1] == 0x5C:  # backslash
        return None
    if not _OPENING_BRACE.match(body):
        return None
    is_top_level = body.count(b"{", 0, at) == 1 or (
        body.count(b"}", at) == 1 and body[-64:].rstrip().endswith(b"}")
    )
    value = _MODEL_VALUE.match(body, at + len(_MODEL_KEY)) if is_top_level else None
    if value is None:
        return None
    try:
        return value.group(1).decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_model(body: bytes) -> tuple[str, int]:
    """``parse_model``'s answer, by a byte scan when the body has no ``input`` to count.

    Chat and completion bodies (long prompts, no ``input``) are scanned, not parsed: the
    gateway reads only what routing needs and forwards the bytes as they came; the worker
    validates the body either way.
    """
    if _INPUT_KEY not in body:
        model = scan_model(body)
        if model is not None:
            return model, 1
    return parse_model(body)
