"""The token embedding table (Hugging Face's ``embed_tokens``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conveyor.engine.model.layers.linear import empty_param

__all__ = ["Embedding"]


class Embedding(nn.Module):
    """One row of ``hidden_size`` values per token id, filled from the checkpoint."""

    def __init__(
        self, vocab_size: int, hidden_size: int, *, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.weight = empty_param(vocab_size, hidden_size, device=device, dtype=dtype)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Look up the rows for ``token_ids``."""
        return F.embedding(token_ids, self.weight)
