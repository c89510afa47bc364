"""Where a generation call's CPU work runs: inline when small, off the event loop otherwise.

Preparing a request (tokenizing, the chat template, checking a grammar) is plain CPU
work. A small one runs inline: a thread hop costs more than it does. A large input runs
on the large-input pool (``host.offload.run_sized``). A grammar is checked on a worker thread
whatever its size: llguidance fills its first mask there (the GIL released), which takes
microseconds for an ordinary schema but can take a tenth of a second for a deep one. A
large answer is built off the loop too (``answers``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from conveyor.endpoints.answers import build_body
from conveyor.endpoints.generation import ChoiceResult, GenerationRun, PreparedRun, prepare_counted
from conveyor.errors import InvalidRequest
from conveyor.host.offload import LARGE_INPUT_BYTES, run_sized
from conveyor.host.service import Service
from conveyor.priority import Priority
from conveyor.tenants.usage import Payer

__all__ = ["prepare_off_loop", "run_unstreamed"]

Prepare = Callable[[Service, Any], PreparedRun]


class GenerationBody(Protocol):
    """What preparing and running a parsed generation request reads of it."""

    @property
    def model(self) -> str:
        """The model to run."""
        ...

    @property
    def stream(self) -> bool:
        """Whether the caller asked for a stream."""
        ...

    @property
    def has_grammar(self) -> bool:
        """Whether a grammar constrains the output (checked off the loop)."""
        ...

    def input_bytes(self) -> int:
        """About how many bytes of input the request carries."""
        ...


async def prepare_off_loop(
    service: Service, prepare: Prepare, request: GenerationBody
) -> PreparedRun:
    """``prepare_counted(service, prepare, request)`` where its cost fits (see the module)."""
    num_bytes = request.input_bytes()
    if request.has_grammar and num_bytes < LARGE_INPUT_BYTES:
        return await asyncio.to_thread(prepare_counted, service, prepare, request)
    return await run_sized(num_bytes, prepare_counted, service, prepare, request)


async def run_unstreamed(
    service: Service,
    request: GenerationBody,
    prepare: Prepare,
    make_body: Callable[[GenerationRun, Sequence[ChoiceResult]], dict[str, Any]],
    *,
    priority: Priority,
    timeout_ms: float | None,
    payer: Payer | None = None,
) -> dict[str, Any]:
    """Prepare a parsed request, wait for every choice, format the body; cancelling aborts it.

    The path batch jobs and `endpoints.execute` take: there is nobody to stream to.
    """
    if request.stream:
        raise InvalidRequest("stream: true is not supported here", param="stream")
    prepared = await prepare_off_loop(service, prepare, request)
    run = await prepared.start(service, priority=priority, timeout_ms=timeout_ms, payer=payer)
    try:
        results = await run.collect()
    finally:
        run.close()
    return await build_body(make_body, run, results)
