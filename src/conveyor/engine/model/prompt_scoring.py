"""Prompt logprobs: the log-softmax at the prompt positions a step's chunks asked to score.

A chunk's ``scoring`` names positions and the token that follows each. Their hidden states
go through the final norm and the LM head a slice of rows at a time, so a long prompt
never holds more than ``SLICE_ROWS`` rows of vocabulary-wide logits; a step without
scoring does none of this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.outputs import TokenLogprobs

__all__ = ["SLICE_ROWS", "ScoringRows", "score_rows", "scoring_rows"]

# Rows of logits computed at once: 256 x a 150k vocabulary in float32 is about 150 MB.
SLICE_ROWS = 256


class ScoringRows:
    """Where a step's scored positions sit among its tokens, and what each is scored on."""

    __slots__ = ("counts", "num_tops", "rows", "targets")

    def __init__(self) -> None:
        self.rows: list[int] = []  # index of the position's token in the step
        self.targets: list[int] = []  # the token that follows it
        self.num_tops: list[int] = []  # alternatives wanted there
        self.counts: list[int] = []  # positions per scored chunk, in chunk order

    def __len__(self) -> int:
        return len(self.rows)


def scoring_rows(chunks: Sequence[SeqChunk]) -> ScoringRows:
    """The scored positions of ``chunks``, whose tokens the step packs in chunk order."""
    found = ScoringRows()
    token_start = 0
    for chunk in chunks:
        scoring = chunk.scoring
        if scoring is not None:
            first = token_start + scoring.first_pos - chunk.start_pos
            count = len(scoring.target_ids)
            found.rows.extend(range(first, first + count))
            found.targets.extend(scoring.target_ids)
            found.num_tops.extend([scoring.num_top] * count)
            found.counts.append(count)
        token_start += len(chunk.token_ids)
    return found


def score_rows(
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    scoring: ScoringRows,
) -> list[tuple[TokenLogprobs, ...]]:
    """Each scored chunk's ``TokenLogprobs``, one per position, from hidden states [T, h].

    ``logits_of`` turns hidden rows into logits (the final norm and the LM head).
    """
    device = hidden.device
    num_top = max(scoring.num_tops, default=0)
    chosen: list[float] = []
    top_values: list[list[float]] = []
    top_ids: list[list[int]] = []
    for start in range(0, len(scoring), SLICE_ROWS):
        rows = torch.tensor(scoring.rows[start : start + SLICE_ROWS], device=device)
        targets = torch.tensor(scoring.targets[start : start + SLICE_ROWS], device=device)
        log_probs = torch.log_softmax(logits_of(hidden[rows]).to(torch.float32), dim=-1)
        chosen.extend(log_probs.gather(-1, targets[:, None])[:, 0].tolist())
        if num_top:
            values, ids = log_probs.topk(num_top, dim=-1)
            top_values.extend(values.tolist())
            top_ids.extend(ids.tolist())
    entries = [
        TokenLogprobs(
            token_id=target,
            logprob=float(chosen[row]),
            top=tuple(zip(top_ids[row][:count], top_values[row][:count], strict=True))
            if count
            else (),
        )
        for row, (target, count) in enumerate(zip(scoring.targets, scoring.num_tops, strict=True))
    ]
    scores: list[tuple[TokenLogprobs, ...]] = []
    offset = 0
    for count in scoring.counts:
        scores.append(tuple(entries[offset : offset + count]))
        offset += count
    return scores
