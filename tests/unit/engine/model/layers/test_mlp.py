"""The gated MLP: gate and up in one matmul with SiLU and the product after it, or, packed
apart in bfloat16 on the CPU, SiLU and the product as oneDNN post-ops of their matmuls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.layers import linear
from conveyor.engine.model.layers.linear import (
    Linear,
    bfloat16_packing_supported,
    prepack_projections,
)
from conveyor.engine.model.layers.mlp import MLP, fuse_gated_mlps

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

HIDDEN, INTERMEDIATE = 32, 48

needs_packing = pytest.mark.skipif(
    not bfloat16_packing_supported(), reason="no bfloat16 hardware here (AVX512-BF16, AMX)"
)


def _mlp(dtype: torch.dtype, *, bias: bool = False) -> MLP:
    config = DecoderConfig.from_hf(
        {
            "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
            "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 64,
            "mlp_bias": bias,
        }
    )  # fmt: skip
    mlp = MLP(config, device=torch.device("cpu"), dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    for param in mlp.parameters():
        param.data.copy_(0.2 * torch.randn(param.shape, generator=generator))
    return mlp


def _reference(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    """The block in float32 from the module's (unpacked) weights and biases."""

    def project(layer: Linear, rows: torch.Tensor) -> torch.Tensor:
        bias = None if layer.bias is None else layer.bias.float()
        return F.linear(rows, layer.weight.float(), bias)

    gate, up = project(mlp.gate_up_proj, x.float()).split(INTERMEDIATE, dim=-1)
    return project(mlp.down_proj, F.silu(gate) * up)


@needs_packing
@pytest.mark.parametrize("rows", [1, 5, 16, 300])
def test_fused_bfloat16_is_as_close_to_float32_as_the_unfused_block(rows: int) -> None:
    unfused, fused = _mlp(torch.bfloat16), _mlp(torch.bfloat16)
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
    x = x.to(torch.bfloat16)
    expected = _reference(unfused, x)
    assert fuse_gated_mlps(fused) == 1
    assert prepack_projections(fused) == 1  # down_proj; gate_up has nothing left to pack
    prepack_projections(unfused)
    with torch.inference_mode():
        out, plain = fused(x), unfused(x)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, HIDDEN)
    fused_error = (out.float() - expected).abs().max().item()
    plain_error = (plain.float() - expected).abs().max().item()
    # Rounded fewer times than the unfused block (SiLU from the accumulators): no worse.
    assert fused_error <= 1.5 * plain_error + 1e-2
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=2e-2)


@needs_packing
def test_fusing_frees_the_unpacked_weight_and_the_module_still_packs() -> None:
    mlp = _mlp(torch.bfloat16)
    assert mlp.fuse_activation()
    assert mlp.packed_gate_and_up is not None
    assert mlp.gate_up_proj.weight.numel() == 0
    assert not mlp.gate_up_proj.prepack()  # nothing to pack, and no error
    assert mlp.down_proj.prepack()


@pytest.mark.parametrize(
    ("dtype", "bias"), [(torch.float32, False), (torch.float16, False), (torch.bfloat16, True)]
)
def test_fusing_is_refused_where_it_does_not_pay_or_apply(dtype: torch.dtype, bias: bool) -> None:
    mlp = _mlp(dtype, bias=bias)
    weight = mlp.gate_up_proj.weight
    assert not mlp.fuse_activation()
    assert mlp.packed_gate_and_up is None and mlp.gate_up_proj.weight is weight
    x = torch.randn(3, HIDDEN).to(dtype)
    torch.testing.assert_close(mlp(x).float(), _reference(mlp, x), atol=5e-2, rtol=2e-2)


def test_fusing_is_refused_where_bfloat16_is_multiplied_in_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A CPU without bfloat16 dot products: the projections pack bfloat16 as float32, where
    # the fused post-ops measured no faster; gate_up stays one packed matmul.
    monkeypatch.setattr(linear, "bfloat16_packing_supported", lambda: False)
    mlp = _mlp(torch.bfloat16)
    x = torch.randn(5, HIDDEN).to(torch.bfloat16)
    expected = _reference(mlp, x)
    assert not mlp.fuse_activation()
    assert mlp.packed_gate_and_up is None
    assert prepack_projections(mlp) == 2
    assert mlp.gate_up_proj.packed is not None
    assert mlp.gate_up_proj.packed.dtype == torch.float32
    out = mlp(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=2e-2)
