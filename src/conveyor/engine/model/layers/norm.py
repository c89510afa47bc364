"""RMSNorm, as the Llama family computes it."""

from __future__ import annotations

import torch
from torch import nn

from conveyor.engine.model.layers import fused_ops
from conveyor.engine.model.layers.linear import empty_param

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back, as the reference models do."""

    def __init__(self, size: int, eps: float, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = empty_param(size, device=device, dtype=dtype)
        self.eps = eps
        # Conveyor's fused CPU kernel (``native_kernels``), where the runner installed it.
        self.native = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise over the last dimension (in one pass where the native kernel runs)."""
        if fused_ops.eager_native(self.native) and x.dtype == self.weight.dtype:
            return fused_ops.rms_norm(x, self.weight, self.eps)
        in_dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(in_dtype)
