"""What reshapes logits before a token is picked: bias, repeat penalties, a grammar's mask.

Order, as vLLM and OpenAI apply them: ``logit_bias`` is added, then the repetition
penalty (over prompt and output: positive logits divided, negative ones multiplied),
then presence and frequency penalties (over generated tokens only), then tokens a
grammar forbids are set to ``-inf``. Temperature, top-k, top-p and min-p come after, in
the sampler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from conveyor.engine.sampling.params import SamplingParams

__all__ = ["TokenHistory", "shape_logits"]


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """One row's tokens so far: the prompt then the output, and where the output starts."""

    token_ids: Sequence[int]
    num_prompt_tokens: int

    @property
    def output_ids(self) -> Sequence[int]:
        """The generated tokens."""
        return self.token_ids[self.num_prompt_tokens :]


def shape_logits(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[TokenHistory | None] | None,
    allowed: torch.Tensor | None,
) -> torch.Tensor:
    """``logits`` [N, V] float32 after bias, penalties and the mask (a copy when changed).

    ``allowed`` is a bool [N, V] (True: the grammar permits the token), or None.
    """
    rows = [row for row, p in enumerate(params) if p.shapes_logits]
    if not rows and allowed is None:
        return logits
    shaped = logits.clone()
    for row in rows:
        history = histories[row] if histories is not None else None
        _shape_row(shaped[row], params[row], history)
    if allowed is not None:
        shaped.masked_fill_(~_fit_width(allowed, shaped.shape[1]).to(shaped.device), -math.inf)
    return shaped


def _fit_width(allowed: torch.Tensor, width: int) -> torch.Tensor:
    """The mask cut or padded (with False: not a token) to the logits' width."""
    if allowed.shape[1] >= width:
        return allowed[:, :width]
    padding = torch.zeros((allowed.shape[0], width - allowed.shape[1]), dtype=torch.bool)
    return torch.cat([allowed, padding.to(allowed.device)], dim=1)


def _shape_row(row: torch.Tensor, params: SamplingParams, history: TokenHistory | None) -> None:
    """Bias and penalties of one row, in place."""
    vocab_size = row.shape[0]
    device = row.device
    if params.logit_bias:
        ids = torch.tensor([i for i, _ in params.logit_bias if i < vocab_size], device=device)
        bias = [v for i, v in params.logit_bias if i < vocab_size]
        row.index_add_(0, ids, torch.tensor(bias, dtype=row.dtype, device=device))
    if history is None:
        return
    if params.repetition_penalty != 1.0 and history.token_ids:
        seen = torch.tensor(sorted(set(history.token_ids)), device=device)
        seen = seen[seen < vocab_size]
        values = row[seen]
        penalty = params.repetition_penalty
        row[seen] = torch.where(values > 0, values / penalty, values * penalty)
    output = history.output_ids
    if (params.presence_penalty or params.frequency_penalty) and output:
        ids = torch.tensor(list(output), device=device)
        ids = ids[ids < vocab_size]
        counts = torch.bincount(ids, minlength=vocab_size).to(row.dtype)
        row -= params.frequency_penalty * counts
        row -= params.presence_penalty * (counts > 0).to(row.dtype)
