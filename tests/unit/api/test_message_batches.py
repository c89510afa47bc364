"""The create body of a Message Batch is read up to its own bound (not the general body cap)."""

from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.types import Message

from conveyor.api.message_batches import read_capped
from conveyor.errors import RequestTooLarge

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def streamed(*chunks: bytes) -> Request:
    messages: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
        for index, chunk in enumerate(chunks)
    ]

    async def receive() -> Message:
        return messages.pop(0)

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


async def test_a_body_within_the_bound_is_read_whole() -> None:
    assert await read_capped(streamed(b"ab", b"cd", b"e"), 5) == b"abcde"


async def test_a_body_past_the_bound_is_413_as_soon_as_it_passes() -> None:
    with pytest.raises(RequestTooLarge, match="limited to 4 bytes"):
        await read_capped(streamed(b"ab", b"cd", b"e", b"never read"), 4)
