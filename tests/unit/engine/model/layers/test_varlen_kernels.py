"""Choosing the GPU's varlen kernel, and the adapters' contracts with their libraries."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from conveyor.engine.model.layers.varlen_kernels import (
    FlashAttnVarlen,
    FlashInferVarlen,
    KernelShape,
    VarlenUnavailable,
    install_varlen_kernel,
    select_varlen_kernel,
)
from conveyor.engine.model.paged_varlen import VarlenSequence, paged_varlen
from conveyor.fakes.varlen import flash_attn_module, flashinfer_module, stand_in_kernel

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


def shape(
    block_size: int = 16, device: str = "cuda", dtype: torch.dtype = torch.bfloat16
) -> KernelShape:
    return KernelShape(
        num_heads=4, num_kv_heads=2, head_dim=8, block_size=block_size,
        dtype=dtype, device=torch.device(device), windows=frozenset({None}),
    )  # fmt: skip


def importer(**modules: Any) -> Any:
    """An import function that knows only ``modules`` (others: not installed)."""

    def load(name: str) -> ModuleType | Any:
        if name not in modules:
            raise ImportError(f"No module named {name!r}")
        return modules[name]

    return load


def test_conveyor_means_no_varlen_kernel() -> None:
    both = importer(flashinfer=flashinfer_module(), flash_attn=flash_attn_module())
    kernel, reason = select_varlen_kernel("conveyor", shape(), both)
    assert kernel is None and "conveyor" in reason


def test_auto_on_a_cpu_is_conveyors_attention() -> None:
    both = importer(flashinfer=flashinfer_module(), flash_attn=flash_attn_module())
    kernel, reason = select_varlen_kernel("auto", shape(device="cpu"), both)
    assert kernel is None
    assert "flashinfer runs on CUDA only" in reason and "flash_attn runs on CUDA only" in reason


def test_auto_prefers_flashinfer() -> None:
    both = importer(flashinfer=flashinfer_module(), flash_attn=flash_attn_module())
    kernel, reason = select_varlen_kernel("auto", shape(block_size=256), both)
    assert isinstance(kernel, FlashInferVarlen) and reason == "flashinfer's varlen paged kernel"


def test_auto_takes_flash_attn_where_its_pages_fit() -> None:
    only_flash_attn = importer(flash_attn=flash_attn_module())
    kernel, _ = select_varlen_kernel("auto", shape(block_size=512), only_flash_attn)
    assert isinstance(kernel, FlashAttnVarlen)
    kernel, reason = select_varlen_kernel("auto", shape(block_size=16), only_flash_attn)
    assert kernel is None
    assert "flashinfer is not installed" in reason
    assert "multiple of 256 tokens; block_size is 16" in reason


def test_a_named_backend_that_cannot_serve_is_an_error() -> None:
    only_flash_attn = importer(flash_attn=flash_attn_module())
    with pytest.raises(VarlenUnavailable, match="flashinfer is not installed"):
        select_varlen_kernel("flashinfer", shape(), only_flash_attn)
    with pytest.raises(VarlenUnavailable, match="block_size is 16"):
        select_varlen_kernel("flash_attn", shape(block_size=16), only_flash_attn)
    with pytest.raises(VarlenUnavailable, match="CUDA only"):
        select_varlen_kernel("flash_attn", shape(256, "cpu"), only_flash_attn)
    with pytest.raises(
        VarlenUnavailable, match=r"float16 or bfloat16; the model is torch\.float32"
    ):
        select_varlen_kernel("flash_attn", shape(256, dtype=torch.float32), only_flash_attn)


def test_an_installed_library_that_does_not_load_is_passed_over() -> None:
    def broken(name: str) -> Any:
        if name == "flashinfer":
            raise OSError("libcudart.so.12: cannot open shared object file")
        return flash_attn_module()

    kernel, reason = select_varlen_kernel("auto", shape(block_size=256), broken)
    assert isinstance(kernel, FlashAttnVarlen)
    kernel, reason = select_varlen_kernel("auto", shape(block_size=16), broken)
    assert kernel is None and "flashinfer is installed but does not load (libcudart" in reason


def test_flash_attn_without_a_paged_varlen_kernel_is_refused() -> None:
    def flash_attn_varlen_func(q: Any, k: Any, v: Any, cu_seqlens_q: Any) -> Any:
        raise AssertionError("not called")

    old = importer(flash_attn=SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func))
    with pytest.raises(VarlenUnavailable, match=r"before 2\.5"):
        select_varlen_kernel("flash_attn", shape(block_size=256), old)


@pytest.mark.parametrize("name", ["flashinfer", "flash_attn"])
def test_a_call_before_any_plan_is_an_error(name: str) -> None:
    cpu = shape(block_size=256, device="cpu")
    kernel = stand_in_kernel(name, cpu)
    q = torch.zeros(2, 4, 8)
    cache = torch.zeros(4, 256, 2, 8)
    with pytest.raises(RuntimeError, match="after plan"):
        kernel(q, cache, cache, None)


@pytest.mark.parametrize(("name", "block_size"), [("flashinfer", 4), ("flash_attn", 256)])
@pytest.mark.parametrize("window", [None, 3])
def test_adapters_attend_each_sequence_over_its_own_pages(
    name: str, block_size: int, window: int | None
) -> None:
    """Against the same attention computed one sequence at a time from contiguous keys."""
    torch.manual_seed(0)
    cpu = KernelShape(4, 2, 8, block_size, torch.float32, torch.device("cpu"), frozenset({window}))
    kernel = stand_in_kernel(name, cpu)
    # A whole prompt of 3, a decode at position 6, a chunk of 2 ending a context of 5.
    sequences = [
        VarlenSequence(3, 3, (5, 1)),
        VarlenSequence(1, 7, (2, 0)),
        VarlenSequence(2, 5, (3, 4)),
    ]
    if block_size == 256:
        sequences = [VarlenSequence(s.query_len, s.context_len, s.blocks[:1]) for s in sequences]
    k_cache = torch.randn(6, block_size, 2, 8)
    v_cache = torch.randn(6, block_size, 2, 8)
    step = paged_varlen(sequences, block_size)
    kernel.plan(step, step)
    q = torch.randn(6, 4, 8)
    out = kernel(q, k_cache, v_cache, window)
    start = 0
    for seq in sequences:
        keys = k_cache[list(seq.blocks)].flatten(0, 1)[: seq.context_len]
        values = v_cache[list(seq.blocks)].flatten(0, 1)[: seq.context_len]
        query_pos = torch.arange(seq.context_len - seq.query_len, seq.context_len)[:, None]
        key_pos = torch.arange(seq.context_len)[None, :]
        visible = key_pos <= query_pos
        if window is not None:
            visible &= key_pos > query_pos - window
        want = torch.nn.functional.scaled_dot_product_attention(
            q[start : start + seq.query_len].transpose(0, 1),
            keys.repeat_interleave(2, dim=1).transpose(0, 1),
            values.repeat_interleave(2, dim=1).transpose(0, 1),
            attn_mask=visible,
        ).transpose(0, 1)
        torch.testing.assert_close(out[start : start + seq.query_len], want)
        start += seq.query_len
    assert kernel.num_calls == 1


def test_installing_sets_each_layers_window() -> None:
    attentions = [SimpleNamespace(varlen=None, window=None) for _ in range(2)]
    kernel = FlashAttnVarlen(flash_attn_module(), shape(256, "cpu"))
    install_varlen_kernel(attentions, [None, 16], kernel)  # type: ignore[arg-type]
    assert [(a.varlen, a.window) for a in attentions] == [(kernel, None), (kernel, 16)]
    with pytest.raises(ValueError, match="2 attention layers but 1 windows"):
        install_varlen_kernel(attentions, [None], kernel)  # type: ignore[arg-type]
