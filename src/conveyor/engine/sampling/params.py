"""How a request wants its tokens picked, and when it stops: validated, torch-free.

Callers that only build or check parameters (the HTTP layer, batch validation) import
this module without loading torch; the sampler that applies them lives in ``sampler``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["MAX_LOGPROBS", "SamplingParams"]

MAX_LOGPROBS = 20
_MAX_SEED = 2**63 - 1


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token of one request, and when to stop.

    ``temperature`` 0 means greedy; ``top_k`` 0 or -1 and ``top_p`` 1.0 mean no cut;
    ``logprobs`` is how many top alternatives to return per token (None: no logprobs);
    ``prompt_logprobs`` the same for every prompt token after the first (None: none; the
    prompt is then computed in full, never served from the prefix cache). ``max_tokens``
    0 runs the prompt and samples nothing (for its prompt logprobs).
    ``stop`` strings and ``stop_token_ids`` end the request; ``ignore_eos`` keeps it going
    past EOS. ``presence_penalty`` / ``frequency_penalty`` (OpenAI's, over generated tokens)
    and ``repetition_penalty`` (over prompt and output; 1.0 is off) discourage repeats;
    ``logit_bias`` adds to chosen tokens' logits; ``min_p`` drops tokens less likely than
    that fraction of the top one. ``grammar`` (llguidance's grammar string, see
    ``engine.sampling.grammar``) restricts output to the grammar. Lists are stored as tuples
    (``stop_token_ids`` as a frozenset).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop: Sequence[str] = ()
    # A set once built: each generated token is looked up in it.
    stop_token_ids: Collection[int] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: Sequence[tuple[int, float]] = ()
    grammar: str | None = None

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, low=0.0, high=None)
        _check_number("top_p", self.top_p, low=0.0, high=1.0)
        if self.top_p <= 0.0:
            raise ValueError(f"top_p must be > 0, got {self.top_p}")
        _check_int("top_k", self.top_k, low=-1, high=None)
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=_MAX_SEED)
        _check_int("max_tokens", self.max_tokens, low=0, high=None)
        if isinstance(self.stop, str):
            raise ValueError("stop must be a list of strings, not a single string")
        if any(not isinstance(text, str) or not text for text in self.stop):
            raise ValueError("stop must contain only non-empty strings")
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, low=0, high=None)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError("ignore_eos must be a boolean")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, low=0, high=MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, low=0, high=MAX_LOGPROBS)
        self._check_shaping()
        # Frozen, so normalise through object.__setattr__: tuples keep the params hashable.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", frozenset(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", tuple(self.logit_bias))

    def _check_shaping(self) -> None:
        """Penalties, bias, min-p and grammar: the fields that reshape the logits."""
        _check_number("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _check_number("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _check_number("repetition_penalty", self.repetition_penalty, low=0.0, high=None)
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check_number("min_p", self.min_p, low=0.0, high=1.0)
        for entry in self.logit_bias:
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise ValueError("logit_bias must hold (token id, bias) pairs")
            _check_int("logit_bias token id", entry[0], low=0, high=None)
            _check_number("logit_bias value", entry[1], low=-100.0, high=100.0)
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar):
            raise ValueError("grammar must be a non-empty string")

    @property
    def shapes_logits(self) -> bool:
        """Whether anything but temperature / top-k / top-p changes the distribution."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )

    @property
    def is_greedy(self) -> bool:
        """Whether the token is the argmax (temperature 0, or a top-k of one)."""
        return self.temperature == 0.0 or self.top_k == 1


def _check_number(name: str, value: object, *, low: float, high: float | None) -> None:
    """ValueError naming ``name`` unless ``value`` is a finite number in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bounds}, got {value}")


def _check_int(name: str, value: object, *, low: int, high: int | None) -> None:
    """ValueError naming ``name`` unless ``value`` is an int in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bounds}, got {value}")
