"""The SiLU-gated feed-forward block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.layers import fused_ops
from conveyor.engine.model.layers.linear import Linear, empty_param, packed_weight, packing_dtype

__all__ = ["MLP", "fuse_gated_mlps"]


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
        # Set by ``fuse_activation``: gate's and up's weights packed apart (oneDNN).
        self.packed_gate_and_up: tuple[torch.Tensor, torch.Tensor] | None = None

    def fuse_activation(self) -> bool:
        """Pack gate's and up's weights apart so that SiLU and the product run inside their
        matmuls as oneDNN post-ops: no [tokens, 2 x intermediate] tensor is written and read
        back. For bfloat16 on a CPU that multiplies it in hardware, without biases (elsewhere
        it measured no faster, and returns False). Call it once the weights are loaded, before
        ``Linear.prepack``; it frees the unpacked gate_up weight, so the module then serves
        eager calls only (no LoRA on gate_up, no compiled layers)."""
        weight = self.gate_up_proj.weight
        # bfloat16 packed as bfloat16 (multiplied in hardware), and no bias.
        if weight.dtype != torch.bfloat16 or packing_dtype(weight.dtype) != weight.dtype:
            return False
        if self.gate_up_proj.bias is not None:
            return False
        half = self.intermediate_size
        gate, up = weight.detach()[:half], weight.detach()[half:]
        packed_gate, packed_up = packed_weight(gate), packed_weight(up)
        if packed_gate is None or packed_up is None:
            return False
        self.packed_gate_and_up = (packed_gate, packed_up)
        self.gate_up_proj.weight = empty_param(0, device=weight.device, dtype=weight.dtype)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP (SiLU and the product fused where packed apart, else in one
        pass where the native kernel runs)."""
        if self.packed_gate_and_up is not None:
            act = _fused_gate_up(x, *self.packed_gate_and_up)
        else:
            gate_up = self.gate_up_proj(x)
            if fused_ops.eager_native(self.native):
                act = fused_ops.silu_and_mul(gate_up)
            else:
                gate, up = gate_up.split(self.intermediate_size, dim=-1)
                act = F.silu(gate) * up
        out: torch.Tensor = self.down_proj(act)
        return out


def _fused_gate_up(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(x gate^T) * (x up^T)``: SiLU applied to the gate's accumulators, the product
    to the up's, each rounded once."""
    mkldnn = torch.ops.mkldnn
    activated = mkldnn._linear_pointwise(x, gate, None, "swish", [], "")
    out: torch.Tensor = mkldnn._linear_pointwise.binary(x, activated, up, None, "mul")
    return out


def fuse_gated_mlps(model: nn.Module) -> int:
    """``MLP.fuse_activation`` every MLP of ``model``; returns how many now run fused."""
    return sum(m.fuse_activation() for m in model.modules() if isinstance(m, MLP))
