"""Answering a generation: errors before the first output, mid-stream, and a caller who left."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.types import Message

from conveyor.api.sse import DONE_EVENT, encode_event, respond
from conveyor.errors import ClientGone, DeadlineExceeded, ModelFault

pytestmark = pytest.mark.anyio


class FakeRun:
    """The part of a generation run ``respond`` uses; counts ``close`` calls."""

    def __init__(self, first_error: Exception | None = None) -> None:
        self.first_error = first_error
        self.num_closes = 0
        self.never = asyncio.Event()

    async def first(self) -> None:
        if self.first_error is not None:
            raise self.first_error

    async def collect(self) -> list[Any]:
        await self.never.wait()  # the result never comes
        return []

    def close(self) -> None:
        self.num_closes += 1


def request(*, disconnects: bool) -> Request:
    async def receive() -> Message:
        if disconnects:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def chunks_then(error: Exception) -> AsyncIterator[dict[str, Any]]:
    yield {"chunk": 1}
    raise error


async def test_an_error_mid_stream_becomes_an_error_event_then_done() -> None:
    run = FakeRun()
    fault = ModelFault("the model failed")
    response = await respond(
        request(disconnects=False), run, is_stream=True,
        make_body=lambda run, results: {}, chunks=chunks_then(fault),
    )  # fmt: skip
    assert response.status_code == 200 and response.media_type == "text/event-stream"
    events = [event async for event in response.body_iterator]
    assert events == [encode_event({"chunk": 1}), encode_event(fault.to_body()), DONE_EVENT]
    assert run.num_closes == 1


async def test_an_error_before_the_first_output_is_a_plain_http_error() -> None:
    run = FakeRun(first_error=DeadlineExceeded("no first token in time"))
    with pytest.raises(DeadlineExceeded):
        await respond(
            request(disconnects=False), run, is_stream=True,
            make_body=lambda run, results: {}, chunks=chunks_then(ModelFault("unused")),
        )  # fmt: skip
    assert run.num_closes == 1


async def test_a_caller_who_leaves_before_the_result_aborts_the_run() -> None:
    run = FakeRun()
    with pytest.raises(ClientGone):
        await respond(
            request(disconnects=True), run, is_stream=False,
            make_body=lambda run, results: {}, chunks=chunks_then(ModelFault("unused")),
        )  # fmt: skip
    assert run.num_closes == 1
