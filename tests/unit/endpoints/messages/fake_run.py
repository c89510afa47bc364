"""A stand-in for a generation run: fixed outputs, and what the Messages shapes read of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from conveyor.engine.outputs import FinishReason, GenerationOutput, RequestTimings


def output(
    text: str,
    num_output_tokens: int,
    finish: FinishReason | None = None,
    stop_string: str | None = None,
) -> GenerationOutput:
    """One output of choice 0."""
    return GenerationOutput(
        index=0, token_ids=(1,), text=text, logprobs=(), finish_reason=finish,
        num_prompt_tokens=7, num_output_tokens=num_output_tokens, num_cached_tokens=0,
        timings=RequestTimings(0.0), stop_string=stop_string,
    )  # fmt: skip


@dataclass
class FakeRun:
    """What ``message_body`` and ``message_events`` read of a ``GenerationRun``."""

    pieces: list[GenerationOutput]
    tool_names: tuple[str, ...] = ()
    id: str = "msg-0123abcd"
    model: str = "m"
    total_prompt_tokens: int = 7
    num_prompt_tokens: list[int] = field(default_factory=lambda: [7])

    async def outputs(self) -> AsyncIterator[GenerationOutput]:
        for piece in self.pieces:
            yield piece
