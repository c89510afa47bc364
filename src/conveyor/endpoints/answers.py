"""How large one generation answer may be, and building a large one off the event loop.

With logprobs an answer holds an entry per output token and per alternative: ``n: 128,
top_logprobs: 20, max_tokens: 400`` is a million entries and some 70 MB of JSON, seconds of
CPU. A model returns at most ``max_logprob_entries`` in one answer (a 400 naming the
parameter otherwise, before tokenizing where ``max_tokens`` is given), and an answer
estimated at ``LARGE_INPUT_BYTES`` or more is built and written on the large-input pool,
in pieces (``large_json``), so other requests are answered meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from conveyor.endpoints.generation import ChoiceResult, GenerationRun
from conveyor.endpoints.large_json import dumps_in_pieces
from conveyor.engine.generator import HostedGenerator
from conveyor.errors import InvalidRequest
from conveyor.host.offload import run_sized

__all__ = ["ENTRY_BYTES", "answer_bytes", "build_body", "check_logprob_entries", "encode_body"]

MakeBody = Callable[[GenerationRun, Sequence[ChoiceResult]], dict[str, Any]]

# About what one logprob entry takes in JSON (a chat entry with its bytes: 60-90).
ENTRY_BYTES = 64


def check_logprob_entries(
    generator: HostedGenerator, num_output_tokens: int, num_logprobs: int | None, *, param: str
) -> None:
    """400 naming ``param`` when the answer may hold more than ``max_logprob_entries``.

    ``num_output_tokens`` is the most the request's choices may produce together; each
    token brings itself and ``num_logprobs`` alternatives (None: no logprobs, no entries).
    """
    if num_logprobs is None:
        return
    limit = generator.config.max_logprob_entries
    entries = num_output_tokens * (1 + num_logprobs)
    if entries > limit:
        raise InvalidRequest(
            f"this request may return {entries} logprob entries ({num_output_tokens} output "
            f"tokens x {1 + num_logprobs}), more than this model returns in one answer "
            f"({limit}, max_logprob_entries); lower n, max_tokens or {param}",
            param=param,
        )


def answer_bytes(results: Sequence[ChoiceResult]) -> int:
    """About how many bytes the answer of ``results`` takes (decides off-loop work)."""
    total = 0
    for result in results:
        total += len(result.text)
        entries = list(result.logprobs)
        if result.prompt_logprobs is not None:
            entries.extend(result.prompt_logprobs.entries)
        if entries:
            total += ENTRY_BYTES * len(entries) * (1 + len(entries[0].top))
    return total


async def build_body(
    make_body: MakeBody, run: GenerationRun, results: Sequence[ChoiceResult]
) -> dict[str, Any]:
    """``make_body(run, results)``: inline when small, on the large-input pool otherwise."""
    return await run_sized(answer_bytes(results), make_body, run, results)


async def encode_body(
    make_body: MakeBody, run: GenerationRun, results: Sequence[ChoiceResult]
) -> bytes:
    """The answer's JSON: built and written inline when small, else off the loop in pieces."""
    return await run_sized(answer_bytes(results), _encoded, make_body, run, results)


def _encoded(make_body: MakeBody, run: GenerationRun, results: Sequence[ChoiceResult]) -> bytes:
    """Build the body and write it in pieces (one call for a small one: pieces are few)."""
    return dumps_in_pieces(make_body(run, results))
