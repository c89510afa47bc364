"""GenerationStream: delivery order, several requests on one stream, errors, closing."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conveyor.engine.outputs import FinishReason, GenerationOutput, RequestTimings
from conveyor.engine.stream import GenerationStream, deliver_threadsafe
from conveyor.errors import DeadlineExceeded, ModelFault

pytestmark = pytest.mark.anyio


def output(index: int, text: str, *, is_last: bool = False, count: int = 1) -> GenerationOutput:
    """A one-token output of request ``index``."""
    return GenerationOutput(
        index=index,
        token_ids=(7,),
        text=text,
        logprobs=(),
        finish_reason=FinishReason.STOP if is_last else None,
        num_prompt_tokens=3,
        num_output_tokens=count,
        num_cached_tokens=0,
        timings=RequestTimings(arrival_s=0.0),
    )


async def drain(stream: GenerationStream) -> list[str]:
    return [item.text async for item in stream]


async def test_iteration_ends_after_every_request_finished() -> None:
    stream = GenerationStream(num_requests=2)
    for item in (output(0, "a"), output(1, "x", is_last=True), output(0, "b", is_last=True)):
        stream.put(item)
    assert await drain(stream) == ["a", "x", "b"]
    assert stream.is_finished


async def test_outputs_from_another_thread_arrive_in_order() -> None:
    stream = GenerationStream()
    items = [output(0, str(i), count=i + 1) for i in range(50)]
    items.append(output(0, "end", is_last=True, count=51))

    def engine_thread() -> None:
        for item in items:  # one batch per "step"
            deliver_threadsafe([(stream, item)])

    thread = threading.Thread(target=engine_thread)
    thread.start()
    texts = await drain(stream)
    thread.join()
    assert texts == [item.text for item in items]


async def test_an_error_is_raised_after_earlier_outputs_and_closes() -> None:
    stream = GenerationStream()
    aborted: list[bool] = []
    stream.set_on_abort(lambda: aborted.append(True))
    stream.put(output(0, "a"))
    stream.put(ModelFault("boom"))
    stream.put(output(0, "late"))  # after close: dropped
    assert (await stream.get()) is not None
    with pytest.raises(ModelFault):
        await stream.get()
    assert stream.is_closed and aborted == [True]


async def test_close_aborts_only_unfinished_requests() -> None:
    finished = GenerationStream()
    calls: list[str] = []
    finished.set_on_abort(lambda: calls.append("finished"))
    finished.put(output(0, "a", is_last=True))
    finished.close()
    unfinished = GenerationStream()
    unfinished.set_on_abort(lambda: calls.append("unfinished"))
    unfinished.put(output(0, "a"))
    unfinished.close()
    unfinished.close()  # idempotent
    assert calls == ["unfinished"]


async def test_deadline_fires_only_before_the_first_output() -> None:
    waiting = GenerationStream()
    waiting.set_deadline(waiting.loop.time())  # already due
    with pytest.raises(DeadlineExceeded):
        await waiting.get()
    started = GenerationStream()
    started.set_deadline(started.loop.time() + 0.001)
    started.put(output(0, "a"))
    await asyncio.sleep(0.01)  # let the (cancelled) timer's time pass
    started.put(output(0, "b", is_last=True))
    assert await drain(started) == ["a", "b"]


def test_a_stream_needs_a_request() -> None:
    async def make() -> None:
        GenerationStream(num_requests=0)

    with pytest.raises(ValueError, match="num_requests"):
        asyncio.run(make())
