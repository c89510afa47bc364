"""Errors on Anthropic's routes leave in Anthropic's shape, whoever raised them.

A refusal may come from any layer (the API key check, the body cap, a rate limit, the
route itself, a gateway's proxy), and each answers with OpenAI's ``{"error": {...}}``. This
layer sits outside them all: on paths under ``/v1/messages`` it rewrites a JSON error
response's body to ``{"type": "error", "error": {"type", "message"}}`` (see
``conveyor.anthropic_errors``), keeping the status and headers. Other paths, successful
responses and streams pass through untouched.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.anthropic_errors import from_openai_body

__all__ = ["ANTHROPIC_PREFIX", "AnthropicErrorShape", "is_anthropic_path"]

ANTHROPIC_PREFIX = "/v1/messages"
_JSON = b"application/json"


def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` is one of Anthropic's routes (``/v1/messages`` and below it)."""
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def anthropic_body(status_code: int, body: bytes) -> bytes:
    """A JSON error body in Anthropic's shape (one already in it is kept as it is)."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("type") == "error":
        return body
    return orjson.dumps(from_openai_body(status_code, parsed))


class AnthropicErrorShape:
    """Rewrites JSON error bodies on Anthropic's paths (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_anthropic_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def shaped_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if message["status"] < 400 or not _is_json(message):
                    await send(message)
                    return
                start = message  # held until the whole body is in
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = anthropic_body(start["status"], b"".join(chunks))
            await send(_with_length(start, len(body)))
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, shaped_send)


def _is_json(start: Message) -> bool:
    """Whether a response start declares a JSON body."""
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == _JSON)
    return False


def _with_length(start: Message, num_bytes: int) -> Message:
    """The response start with its ``content-length`` set to the new body's size."""
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(num_bytes).encode()))
    return {**start, "headers": headers}
