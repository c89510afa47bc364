"""The projection: plain ``F.linear``, or oneDNN-prepacked weights in bfloat16 on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.model.layers import linear
from conveyor.engine.model.layers.linear import Linear, bfloat16_packing_supported

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


def test_float32_keeps_f_linear() -> None:
    layer = _linear(torch.float32, bias=True)
    assert layer.prepack() is False
    assert layer.packed is None
    x = torch.randn(5, 24)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)


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


def test_packing_support_is_what_onednn_says() -> None:
    expected = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert bfloat16_packing_supported() is bool(expected)
