"""What the engine hands back to callers, one value per sampled token: torch-free.

The engine thread builds these; the event loop and the HTTP layer read them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "FinishReason",
    "GenerationOutput",
    "PromptLogprobs",
    "RequestTimings",
    "TokenLogprobs",
]


class FinishReason(enum.Enum):
    """Why a request stopped, in OpenAI's words."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context length


@dataclass(frozen=True, slots=True)
class RequestTimings:
    """Monotonic timestamps (``time.monotonic()``) of one request's life, in seconds."""

    arrival_s: float
    first_token_s: float | None = None
    finished_s: float | None = None

    @property
    def time_to_first_token_s(self) -> float | None:
        """Seconds from arrival to the first sampled token."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The chosen token's log-probability and the ``top`` most likely tokens with theirs.

    Log-probabilities are of the model's raw distribution (before temperature, top-k and
    top-p), as OpenAI reports them.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """How likely the model found each prompt token, given the tokens before it.

    ``entries[i]`` is about ``token_ids[i + 1]`` (its ``top`` alternatives are the most
    likely tokens at that position); the first token, with nothing before it, has none.
    """

    token_ids: tuple[int, ...]
    entries: tuple[TokenLogprobs, ...]

    def __post_init__(self) -> None:
        if len(self.entries) != max(0, len(self.token_ids) - 1):
            raise ValueError(
                f"{len(self.token_ids)} prompt tokens need {len(self.token_ids) - 1} entries, "
                f"got {len(self.entries)}"
            )


@dataclass(frozen=True, slots=True)
class GenerationOutput:
    """What one step added to one request: new token(s), the text they completed, and state.

    ``index`` tells apart the requests sharing one stream (several prompts of one
    completions call). ``text`` is safe to stream (stop strings are never part of it).
    The counts are totals so far; ``finish_reason`` is set on the request's last output.
    """

    index: int
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...]
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    timings: RequestTimings
    # The request's share of its steps' model time so far (by tokens computed), seconds.
    model_s: float = 0.0
    # On the request's first output only, when its params asked for prompt logprobs.
    prompt_logprobs: PromptLogprobs | None = None
    # On the last output of a request a stop string ended: which one it was.
    stop_string: str | None = None

    @property
    def is_finished(self) -> bool:
        """Whether this is the request's last output."""
        return self.finish_reason is not None
