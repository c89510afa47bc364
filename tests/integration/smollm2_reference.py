"""transformers' reading of SmolLM2 as the reference Conveyor's greedy output is held to.

Parity is checked teacher-forced: transformers runs a prompt plus the continuation Conveyor
generated in one forward pass, and at every generated position its argmax must be the token
Conveyor chose, and its log-probability of that token within ``LOGPROB_TOLERANCE`` of the
one Conveyor reported. That is greedy ``generate`` token for token (the first token where
Conveyor left transformers' greedy path would be a position whose argmax differs), at one
forward pass per sequence instead of one per token: 16 prompts x 48 tokens take seconds on
two cores, not minutes. A mismatch names its position and transformers' gap between its two
largest logits there, so a near-tie (``NEAR_TIE``: float rounding may break it either way)
reads apart from a bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LOGPROB_TOLERANCE", "NEAR_TIE", "HFScorer", "Scored", "parity_problems"]

LOGPROB_TOLERANCE = 1e-3
# Top-2 logit gap below which a differing argmax is a near-tie, not necessarily a bug.
NEAR_TIE = 1e-4


@dataclass(frozen=True, slots=True)
class Scored:
    """transformers at each generated position: its argmax, its log-probability of the
    token that was generated there, and the gap between its two largest logits."""

    argmax: tuple[int, ...]
    logprobs: tuple[float, ...]
    top2_gaps: tuple[float, ...]

    def head(self, length: int) -> Scored:
        """The first ``length`` positions."""
        return Scored(self.argmax[:length], self.logprobs[:length], self.top2_gaps[:length])


class HFScorer:
    """Teacher-forced scores of continuations under one transformers model, memoised: a
    continuation that starts one already scored for the same prompt costs nothing."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._done: dict[tuple[int, ...], list[tuple[tuple[int, ...], Scored]]] = {}
        self.num_forward_passes = 0

    def score(self, prompt: Sequence[int], continuation: Sequence[int]) -> Scored:
        """Scores of ``continuation`` after ``prompt`` (both token ids)."""
        key, wanted = tuple(prompt), tuple(continuation)
        for done, scored in self._done.get(key, []):
            if done[: len(wanted)] == wanted:
                return scored.head(len(wanted))
        scored = self._forward(key, wanted)
        self._done.setdefault(key, []).append((wanted, scored))
        return scored

    def _forward(self, prompt: tuple[int, ...], continuation: tuple[int, ...]) -> Scored:
        """One forward pass over prompt + continuation; the rows that predict the latter."""
        ids = torch.tensor([[*prompt, *continuation]])
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0].float()
        self.num_forward_passes += 1
        rows = logits[len(prompt) - 1 : len(prompt) + len(continuation) - 1]
        chosen = torch.tensor(continuation)[:, None]
        logprobs = torch.log_softmax(rows, dim=-1).gather(-1, chosen)[:, 0]
        top2 = rows.topk(2, dim=-1).values
        return Scored(
            argmax=tuple(rows.argmax(dim=-1).tolist()),
            logprobs=tuple(logprobs.tolist()),
            top2_gaps=tuple((top2[:, 0] - top2[:, 1]).tolist()),
        )


def parity_problems(
    scored: Scored, token_ids: Sequence[int], logprobs: Sequence[float]
) -> list[str]:
    """How Conveyor's greedy tokens and their log-probabilities depart from transformers'
    (empty when they agree): the first differing token, and how many logprobs before it are
    off by more than ``LOGPROB_TOLERANCE`` (the worst named)."""
    problems: list[str] = []
    if len(logprobs) != len(token_ids):
        problems.append(f"{len(logprobs)} logprobs for {len(token_ids)} tokens")
    agree = len(token_ids)
    for position, (ours, theirs) in enumerate(zip(token_ids, scored.argmax, strict=True)):
        if ours != theirs:
            gap = scored.top2_gaps[position]
            kind = "a near-tie" if gap < NEAR_TIE else "not a tie"
            problems.append(
                f"token {position}: {ours}, transformers' argmax {theirs} "
                f"(its top-2 logit gap {gap:.2e}: {kind})"
            )
            agree = position
            break
    off = [
        position
        for position in range(min(agree, len(logprobs)))
        if abs(logprobs[position] - scored.logprobs[position]) > LOGPROB_TOLERANCE
    ]
    if off:
        worst = max(off, key=lambda position: abs(logprobs[position] - scored.logprobs[position]))
        problems.append(
            f"{len(off)} logprobs off by more than {LOGPROB_TOLERANCE}; the worst, token "
            f"{worst}: {logprobs[worst]:.6f}, transformers' {scored.logprobs[worst]:.6f}"
        )
    return problems
