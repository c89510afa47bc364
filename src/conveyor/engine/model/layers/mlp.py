"""The SiLU-gated feed-forward block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.layers import fused_ops
from conveyor.engine.model.layers.linear import Linear

__all__ = ["MLP"]


class MLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``, with gate and up packed into one matmul."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(
            config.hidden_size,
            2 * config.intermediate_size,
            bias=config.has_mlp_bias,
            device=device,
            dtype=dtype,
        )
        self.down_proj = Linear(
            config.intermediate_size,
            config.hidden_size,
            bias=config.has_mlp_bias,
            device=device,
            dtype=dtype,
        )
        # Conveyor's fused CPU SiLU-and-multiply (``native_kernels``), where installed.
        self.native = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP (SiLU and the product in one pass where the kernel runs)."""
        gate_up = self.gate_up_proj(x)
        if fused_ops.eager_native(self.native):
            act = fused_ops.silu_and_mul(gate_up)
        else:
            gate, up = gate_up.split(self.intermediate_size, dim=-1)
            act = F.silu(gate) * up
        out: torch.Tensor = self.down_proj(act)
        return out
