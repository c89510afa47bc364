"""Large inputs go to their own pool; a refused one leaves nothing for the event loop to free."""

from __future__ import annotations

import asyncio
import threading
import weakref

import pytest

from conveyor.errors import InvalidRequest
from conveyor.host.offload import LARGE_INPUT_BYTES, run_sized

pytestmark = pytest.mark.anyio


class Tokens(list[int]):
    """A list that can be weakly referenced (a stand-in for a huge prompt's token ids)."""


async def test_a_small_input_runs_inline_and_a_large_one_on_the_pool() -> None:
    loop_thread = threading.get_ident()
    assert await run_sized(10, threading.get_ident) == loop_thread
    assert await run_sized(LARGE_INPUT_BYTES, threading.get_ident) != loop_thread


async def test_a_refused_large_input_is_freed_off_the_event_loop() -> None:
    seen: list[weakref.ref[Tokens]] = []

    def tokenize_then_refuse() -> None:
        tokens = Tokens(range(1000))
        seen.append(weakref.ref(tokens))
        raise InvalidRequest("the prompt is longer than the context")

    with pytest.raises(InvalidRequest) as info:
        await run_sized(LARGE_INPUT_BYTES, tokenize_then_refuse)
    # The failed call's frames were dropped on the pool thread: nothing left to free here.
    assert seen[0]() is None
    assert info.value.message == "the prompt is longer than the context"
    await asyncio.sleep(0)
