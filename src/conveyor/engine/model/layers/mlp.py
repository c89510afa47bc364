"""The SiLU-gated feed-forward block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conveyor.engine.model.hf_config import DecoderConfig
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP."""
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out
