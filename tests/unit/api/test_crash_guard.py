"""The crash guard: which crashes it answers, swallows or lets close the connection."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from starlette.types import Message, Receive, Scope, Send

from conveyor.api.crash_guard import CrashGuard

SCOPE: Scope = {"type": "http", "method": "POST", "path": "/v1/x", "headers": []}


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def run(app: CrashGuard) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(SCOPE, _receive, send))
    return sent


async def crash_after(messages: list[Message], scope: Scope, receive: Receive, send: Send) -> None:
    for message in messages:
        await send(message)
    raise RuntimeError("boom")


START: Message = {"type": "http.response.start", "status": 500, "headers": []}
LAST_BODY: Message = {"type": "http.response.body", "body": b"{}", "more_body": False}


def test_crash_after_a_complete_response_is_swallowed() -> None:
    sent = run(CrashGuard(lambda s, r, w: crash_after([START, LAST_BODY], s, r, w)))
    assert sent == [START, LAST_BODY]


def test_crash_before_any_response_is_an_openai_500() -> None:
    sent = run(CrashGuard(lambda s, r, w: crash_after([], s, r, w)))
    assert sent[0]["status"] == 500
    body = orjson.loads(sent[1]["body"])
    assert body["error"] == {
        "message": "internal server error", "type": "server_error", "param": None, "code": None,
    }  # fmt: skip


def test_crash_mid_response_is_reraised_so_the_server_closes_the_connection() -> None:
    partial: Message = {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
    with pytest.raises(RuntimeError, match="boom"):
        run(CrashGuard(lambda s, r, w: crash_after([START, partial], s, r, w)))
