"""The projection: plain ``F.linear``, or oneDNN-prepacked weights on the CPU (float32, and
bfloat16: as bfloat16 where the CPU multiplies it in hardware, else as float32)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.model.layers import linear
from conveyor.engine.model.layers.linear import (
    Linear,
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


def test_a_cpu_without_bfloat16_dot_products_multiplies_bfloat16_in_float32(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # oneDNN emulates bfloat16 matmuls there, several times slower than float32 ones.
    monkeypatch.setattr(linear, "bfloat16_packing_supported", lambda: False)
    linear._say_bfloat16_in_float32.cache_clear()
    layer, other = _linear(torch.bfloat16, bias=True), _linear(torch.bfloat16, bias=False)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    with caplog.at_level("INFO", logger=linear.__name__):
        assert layer.prepack(release=True) is True
        assert other.prepack() is True
    assert [r.message for r in caplog.records if "multiplied in float32" in r.message] != []
    assert len(caplog.records) == 1  # said once, not per projection
    assert layer.packed is not None and layer.packed.dtype == torch.float32
    assert layer.weight.numel() == 0
    x = torch.randn(9, 24, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (9, 40)
    # Exact products, float32 sums, one rounding to bfloat16: what hardware bfloat16 gives
    # (within a rounding, as the sums' order may differ).
    expected = F.linear(x.float(), weight.float(), bias.float()).to(torch.bfloat16)
    torch.testing.assert_close(out, expected, rtol=2**-8, atol=1e-2)


@pytest.mark.parametrize(
    ("in_hardware", "packed_as"), [(True, torch.bfloat16), (False, torch.float32)]
)
def test_bfloat16_is_packed_as_bfloat16_only_where_the_cpu_multiplies_it(
    monkeypatch: pytest.MonkeyPatch, in_hardware: bool, packed_as: torch.dtype
) -> None:
    # oneDNN packs bfloat16 on any AVX-512 CPU (emulating it without hardware), so both
    # answers can be packed here.
    if in_hardware and not linear._onednn_bfloat16():
        pytest.skip("oneDNN takes no bfloat16 on this CPU")
    monkeypatch.setattr(linear, "bfloat16_packing_supported", lambda: in_hardware)
    layer = _linear(torch.bfloat16, bias=True)
    x = torch.randn(6, 24, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    expected = F.linear(x, layer.weight, layer.bias)
    assert layer.prepack() is True
    assert layer.packed is not None and layer.packed.dtype == packed_as
    assert layer.packed_bias is not None and layer.packed_bias.dtype == packed_as
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=1e-2, rtol=1e-2)


@pytest.fixture
def hardware_answer() -> Iterator[None]:
    """``native_bfloat16_dot`` asked afresh in the test, and again after it."""
    linear.native_bfloat16_dot.cache_clear()
    yield
    linear.native_bfloat16_dot.cache_clear()


@pytest.mark.usefixtures("hardware_answer")
@pytest.mark.parametrize(
    ("machine", "onednn", "expected"),
    [("aarch64", True, True), ("aarch64", False, False), ("arm64", True, True)],
)
def test_off_x86_bfloat16_hardware_is_what_onednn_says(
    monkeypatch: pytest.MonkeyPatch, machine: str, onednn: bool, expected: bool
) -> None:
    # On Arm oneDNN takes bfloat16 only where the CPU multiplies it in hardware; on x86 it
    # also takes it where it would emulate the products, so x86 asks the CPU's flags.
    monkeypatch.setattr(linear.platform, "machine", lambda: machine)
    monkeypatch.setattr(linear, "_onednn_bfloat16", lambda: onednn)
    assert linear.native_bfloat16_dot() is expected


@pytest.mark.usefixtures("hardware_answer")
def test_on_x86_bfloat16_hardware_is_avx512_bf16_or_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(linear, "_onednn_bfloat16", lambda: True)  # not asked on x86
    for avx512_bf16, amx in [(False, False), (True, False), (False, True)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        linear.native_bfloat16_dot.cache_clear()
        assert linear.native_bfloat16_dot() is (avx512_bf16 or amx)
