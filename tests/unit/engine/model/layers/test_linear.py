"""The projection: plain ``F.linear``, or oneDNN-prepacked weights (float32, and bfloat16
where the CPU packs it) on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.model.layers import linear
from conveyor.engine.model.layers.linear import (
    Linear,
    bfloat16_packing_supported,
    prepack_projections,
)

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


def _linear(dtype: torch.dtype, *, bias: bool) -> Linear:
    layer = Linear(24, 40, bias=bias, device=torch.device("cpu"), dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    layer.weight.data.copy_(torch.randn(40, 24, generator=generator))
    if layer.bias is not None:
        layer.bias.data.copy_(torch.randn(40, generator=generator))
    return layer


needs_packing = pytest.mark.skipif(
    not bfloat16_packing_supported(), reason="oneDNN packs no bfloat16 on this CPU"
)


@needs_packing
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 16, 33])
def test_prepacked_bfloat16_matches_f_linear(rows: int, bias: bool) -> None:
    layer = _linear(torch.bfloat16, bias=bias)
    x = torch.randn(rows, 24, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    expected = F.linear(x, layer.weight, layer.bias)
    assert layer.prepack() is True
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 16, 33, 300])
def test_prepacked_float32_matches_f_linear(rows: int, bias: bool) -> None:
    layer = _linear(torch.float32, bias=bias)
    x = torch.randn(rows, 24, generator=torch.Generator().manual_seed(rows))
    expected = F.linear(x, layer.weight, layer.bias)
    assert layer.prepack(release=True) is True
    assert layer.weight.numel() == 0  # the unpacked copy is gone
    assert layer.prepack() is True  # packing again keeps the packed copy
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (rows, 40)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_float16_keeps_f_linear() -> None:
    layer = _linear(torch.float16, bias=True)
    assert layer.prepack() is False
    assert layer.packed is None
    x = torch.randn(5, 24).to(torch.float16)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)


def test_prepack_projections_keeps_a_tied_weight() -> None:
    # The output projection tied to the embedding keeps the shared tensor; the others
    # give their unpacked copies up.
    model = torch.nn.ModuleDict(
        {"proj": _linear(torch.float32, bias=False), "head": _linear(torch.float32, bias=False)}
    )
    embedding = torch.nn.Embedding(40, 24)
    embedding.weight = model["head"].weight
    model["embed"] = embedding
    assert prepack_projections(model) == 2
    assert model["proj"].weight.numel() == 0
    assert model["head"].weight is embedding.weight and embedding.weight.shape == (40, 24)


def test_a_cpu_without_bfloat16_packing_keeps_f_linear(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # An AVX2-only CPU: oneDNN's reorder would raise, so the layer must not ask for it.
    monkeypatch.setattr(linear, "bfloat16_packing_supported", lambda: False)
    linear._warn_unpacked_bfloat16.cache_clear()
    layer = _linear(torch.bfloat16, bias=True)
    with caplog.at_level("WARNING", logger=linear.__name__):
        assert layer.prepack() is False
        assert layer.prepack() is False
    assert [r.message for r in caplog.records if "no native bfloat16" in r.message] != []
    assert len(caplog.records) == 1  # said once, not per projection
    assert layer.packed is None
    x = torch.randn(5, 24).to(torch.bfloat16)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
