"""A projection whose weights come from the checkpoint, never from a random init."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Linear", "empty_param"]


def empty_param(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised parameter: every value is overwritten from the checkpoint."""
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """``y = x W^T + b`` with weights left uninitialised (random init of a big model is slow)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = empty_param(out_features, in_features, device=device, dtype=dtype)
        self.bias = empty_param(out_features, device=device, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the projection."""
        return F.linear(x, self.weight, self.bias)
