"""The native fused RMSNorm, SiLU-and-multiply, rotation, KV write and prefill attention
against PyTorch's ops, and where the runner puts them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.layers import fused_ops
from conveyor.engine.model.layers.attention import Attention
from conveyor.engine.model.layers.mlp import MLP
from conveyor.engine.model.layers.native_kernels import native_library, prefill_attention_runs
from conveyor.engine.model.layers.norm import RMSNorm
from conveyor.engine.model.layers.rotary import apply_rope, rope_angles
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.fakes.checkpoints import build_tiny_llama

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Rows of a decode step and of a prefill chunk; widths with and without a vector tail (64
# and 576: reduced dtypes norm in whole vectors).
SHAPES = ((1, 64), (16, 576), (300, 100), (2, 3, 48))


@pytest.fixture(scope="module", autouse=True)
def _library() -> None:
    assert native_library() is not None, "the suite's machine builds the kernels (g++)"


def reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as PyTorch's ops compute it (``RMSNorm.forward`` without the kernel)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def assert_within_an_ulp(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to about one unit in the last place of their dtype: only the order of the sum
    of squares (and SiLU's exp in vector tails) differs from PyTorch's."""
    torch.testing.assert_close(actual, expected, rtol=torch.finfo(expected.dtype).eps, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_pytorch(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(shape, generator=gen)).to(dtype)
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    out = fused_ops.rms_norm(x, weight, 1e-5)
    assert out.shape == x.shape and out.dtype == dtype
    assert_within_an_ulp(out, reference_norm(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rms_norm_matches_the_add_then_the_norm(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    gen = torch.Generator().manual_seed(5)
    residual, delta = ((3 * torch.randn(shape, generator=gen)).to(dtype) for _ in range(2))
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    added, normed = fused_ops.add_rms_norm(residual, delta, weight, 1e-5)
    assert torch.equal(added, residual + delta)  # rounded as PyTorch's add rounds
    assert normed.shape == residual.shape and normed.dtype == dtype
    assert_within_an_ulp(normed, reference_norm(residual + delta, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_silu_and_mul_matches_pytorch(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(1)
    gate_up = (4 * torch.randn(*shape[:-1], 2 * shape[-1], generator=gen)).to(dtype)
    gate, up = torch.split(gate_up, shape[-1], dim=-1)
    out = fused_ops.silu_and_mul(gate_up)
    assert out.shape == shape and out.dtype == dtype
    assert_within_an_ulp(out, F.silu(gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "heads", "dim"), [(1, 12, 64), (3, 8, 128), (37, 3, 40), (5, 2, 6)]
)
def test_rope_matches_pytorch(dtype: torch.dtype, tokens: int, heads: int, dim: int) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    cos, sin = rope_angles(positions, inv_freq, dtype)
    out = fused_ops.rope(x, cos, sin)
    assert out.shape == x.shape and out.dtype == dtype
    assert_within_an_ulp(out, apply_rope(x, cos, sin))


def test_strided_inputs_are_read_as_their_values() -> None:
    wide = torch.randn(8, 2 * 96)
    x = wide[:, 96:]  # not contiguous
    weight = torch.randn(96)
    torch.testing.assert_close(fused_ops.rms_norm(x, weight, 1e-6), reference_norm(x, weight, 1e-6))
    gate_up = torch.randn(192, 8).t()  # [8, 192], transposed
    gate, up = torch.split(gate_up, 96, dim=-1)
    torch.testing.assert_close(fused_ops.silu_and_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [16, 64])  # 64: reduced dtypes rotate in whole vectors
def test_rope_reads_a_slice_of_a_packed_projection_in_place(dtype: torch.dtype, dim: int) -> None:
    qkv = torch.randn(9, 5 * dim).to(dtype)  # 3 query, 1 key, 1 value heads of dim
    qk = qkv[:, : 4 * dim].view(9, 4, dim)  # token stride 5 dim, head stride dim
    tail = qkv[0, 4 * dim :].clone()
    positions = torch.arange(9)
    cos, sin = rope_angles(positions, 1.0 / (100.0 ** (torch.arange(0, dim, 2) / dim)), dtype)
    out = fused_ops.rope(qk, cos, sin)
    assert out.is_contiguous() and out.shape == (9, 4, dim)
    assert_within_an_ulp(out, apply_rope(qk, cos, sin))
    assert torch.equal(qkv[0, 4 * dim :], tail)  # the input is read, not written
    odd = torch.randn(9, dim, 4).to(dtype).transpose(1, 2)  # head values not contiguous
    assert_within_an_ulp(fused_ops.rope(odd, cos, sin), apply_rope(odd, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_slots_matches_index_copy(dtype: torch.dtype) -> None:
    """Keys sliced from a rotated [T, q + kv heads, dim] buffer and values from a packed
    projection (rows far apart, each row's heads contiguous) land where index_copy_ puts
    them, and nothing else changes."""
    gen = torch.Generator().manual_seed(0)
    rotated = torch.randn(40, 12, 64, generator=gen).to(dtype)
    qkv = torch.randn(40, 960, generator=gen).to(dtype)
    slots = torch.randperm(100, generator=gen)[:40]
    for src in (rotated[:, 9:], qkv[:, 768:].view(40, 3, 64)):
        assert fused_ops.can_write_slots(torch.empty(100, 3, 64, dtype=dtype), src)
        expected = torch.randn(100, 3, 64, generator=gen).to(dtype)
        cache = expected.clone()
        fused_ops.write_slots(cache, slots, src)
        assert torch.equal(cache, expected.index_copy_(0, slots, src))


def test_write_slots_refuses_a_slot_outside_the_cache_and_writes_nothing() -> None:
    cache = torch.zeros(8, 2, 4)
    src = torch.ones(3, 2, 4)
    for bad in (8, -1):
        with pytest.raises(RuntimeError, match="outside the cache"):
            fused_ops.write_slots(cache, torch.tensor([0, 1, bad]), src)
        assert not cache.any()


def test_a_kv_source_write_slots_cannot_take_is_written_by_index_copy() -> None:
    """Rows whose heads are not contiguous, another dtype or a strided cache: the layer's
    write falls back to index_copy_ (the op would refuse them)."""
    cache = torch.zeros(8, 2, 4)
    assert not fused_ops.can_write_slots(cache, torch.ones(4, 2, 2, 4)[:, :, 0])
    assert not fused_ops.can_write_slots(cache, torch.ones(3, 4, 2).transpose(1, 2))
    assert not fused_ops.can_write_slots(cache, torch.ones(3, 2, 4, dtype=torch.bfloat16))
    assert not fused_ops.can_write_slots(torch.zeros(8, 2, 8)[:, :, :4], torch.ones(3, 2, 4))
    with pytest.raises(RuntimeError, match="contiguous"):
        fused_ops.write_slots(cache, torch.arange(3), torch.ones(3, 4, 2).transpose(1, 2))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(RuntimeError, match="elements for rows of"):
        fused_ops.rms_norm(torch.randn(2, 8), torch.randn(7), 1e-5)
    with pytest.raises(RuntimeError, match="dtypes differ"):
        fused_ops.rms_norm(torch.randn(2, 8), torch.randn(8).bfloat16(), 1e-5)
    with pytest.raises(RuntimeError, match="shapes differ"):
        fused_ops.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), 1e-5)
    with pytest.raises(RuntimeError, match="dtypes differ"):
        fused_ops.add_rms_norm(torch.randn(2, 8), torch.randn(2, 8).double(), torch.randn(8), 1e-5)
    with pytest.raises(RuntimeError, match="must be even"):
        fused_ops.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="even dim"):
        fused_ops.rope(torch.randn(2, 3, 5), torch.randn(2, 1, 5), torch.randn(2, 1, 5))
    with pytest.raises(RuntimeError, match=r"\[T, 1, dim\]"):
        fused_ops.rope(torch.randn(2, 3, 4), torch.randn(1, 1, 4), torch.randn(1, 1, 4))


def test_the_modules_give_the_same_answer_with_the_kernels() -> None:
    norm = RMSNorm(64, 1e-5, device=torch.device("cpu"), dtype=torch.float32)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(5, 64)
    plain = norm(x)
    norm.native = True
    assert_within_an_ulp(norm(x), plain)


def test_compiled_code_keeps_pytorchs_ops_unbroken() -> None:
    """Inside ``torch.compile`` the modules use PyTorch's ops, which inductor fuses with
    their neighbours: the kernels are for eager steps."""
    norm = RMSNorm(64, 1e-5, device=torch.device("cpu"), dtype=torch.float32)
    torch.nn.init.normal_(norm.weight)
    norm.native = True
    x = torch.randn(5, 64)
    compiled = torch.compile(norm, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x), reference_norm(x, norm.weight, 1e-5))


@pytest.mark.parametrize("native", [True, False])
def test_the_runner_gives_every_layer_the_kernels_with_native_kernels(
    llama_path: Path, native: bool
) -> None:
    runner = ModelRunner(llama_path, num_kv_blocks=8, block_size=4, native_kernels=native)
    modules = list(runner.model.modules())
    fused = [m.native for m in modules if isinstance(m, (RMSNorm, MLP))]
    fused += [m.native_rope for m in modules if isinstance(m, Attention)]
    fused += [m.native_kv_write for m in modules if isinstance(m, Attention)]
    assert fused and all(flag is native for flag in fused)


def test_a_runners_mlp_gives_the_same_answer_with_the_kernel(llama_path: Path) -> None:
    runner = ModelRunner(llama_path, num_kv_blocks=8, block_size=4)
    mlp = next(m for m in runner.model.modules() if isinstance(m, MLP))
    assert mlp.native
    x = torch.randn(3, runner.config.hidden_size)
    fused = mlp(x)
    mlp.native = False
    assert_within_an_ulp(fused, mlp(x))


def test_a_runners_kv_write_fills_the_cache_as_index_copy_does(llama_path: Path) -> None:
    """A prompt's prefill and a decode step leave the same cache, and the decode the same
    logits, with the native KV write as with index_copy_."""
    prompt = SeqChunk(tuple(range(1, 8)), 0, (0, 1), needs_logits=True)
    decode = SeqChunk((9,), 7, (0, 1), needs_logits=True)
    answers = []
    for native in (True, False):
        runner = ModelRunner(llama_path, num_kv_blocks=8, block_size=4)
        layers = [m for m in runner.model.modules() if isinstance(m, Attention)]
        assert all(layer.native_kv_write for layer in layers)
        for layer in layers:
            layer.native_kv_write = native
        runner.execute([prompt])
        logits = runner.execute([decode])
        answers.append((logits, [tensor.clone() for kv in runner.kv_caches for tensor in kv]))
    (logits, caches), (reference_logits, reference_caches) = answers
    assert torch.equal(logits, reference_logits)
    assert all(map(torch.equal, caches, reference_caches))


def test_a_runners_layers_fuse_each_residual_add_into_the_next_norm(llama_path: Path) -> None:
    runner = ModelRunner(llama_path, num_kv_blocks=8, block_size=4)
    prompt = [SeqChunk(tuple(range(5, 12)), 0, (0, 1), needs_logits=True)]
    with torch.profiler.profile() as profiled:
        fused = runner.execute(prompt)
    calls = [event.name for event in profiled.events()].count("conveyor_native::add_rms_norm")
    assert calls == 2 * runner.config.num_layers - 1  # every add but the last layer's MLP's
    for module in runner.model.modules():
        if isinstance(module, RMSNorm):
            module.native = False  # the layers' own forward: an add, then a norm
    torch.testing.assert_close(runner.execute(prompt), fused, rtol=1e-5, atol=1e-5)


needs_prefill_kernel = pytest.mark.skipif(
    not prefill_attention_runs(),
    reason="the bfloat16 prefill attention needs AVX512-BF16 and torch's AVX-512 vectors",
)
# The prefill attention's dtypes, each skipped where this CPU lacks what it is built for.
PREFILL_DTYPES = [
    pytest.param(torch.bfloat16, marks=needs_prefill_kernel, id="bfloat16"),
    pytest.param(
        torch.float32,
        marks=pytest.mark.skipif(
            not prefill_attention_runs(torch.float32),
            reason="the float32 prefill attention needs AVX-512 or AVX2",
        ),
        id="float32",
    ),
]
# Its error against float64 may exceed SDPA's by this much more than half again.
PREFILL_SLACK = {torch.bfloat16: 2e-3, torch.float32: 1e-6}


def _sdpa_prompts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, count: int) -> torch.Tensor:
    """SDPA of ``count`` prompts (or chunks) back to back, in q's dtype, as [T, heads, dim]:
    each one's queries are the last of its keys (a causal mask aligned to the bottom right;
    as many keys as queries: plain causal)."""
    tokens, heads, dim = q.shape
    length, keys = tokens // count, k.shape[0] // count
    query_pos = torch.arange(keys - length, keys)[:, None]
    hidden = torch.arange(keys)[None, :] > query_pos
    mask = torch.zeros(length, keys, dtype=q.dtype).masked_fill_(hidden, float("-inf"))

    def batched(x: torch.Tensor, rows: int) -> torch.Tensor:
        return x.reshape(count, rows, x.shape[1], dim).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        batched(q, length), batched(k, keys), batched(v, keys), attn_mask=mask,
        enable_gqa=k.shape[1] != heads,
    )  # fmt: skip
    return out.transpose(1, 2).reshape(tokens, heads, dim)


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
@pytest.mark.parametrize(
    ("count", "length", "heads", "kv_heads", "dim"),
    [
        (16, 128, 9, 3, 64),
        (3, 37, 4, 2, 64),
        (2, 70, 8, 8, 128),
        (4, 1, 4, 1, 64),
        (1, 600, 2, 1, 64),  # one prompt's blocks split into runs, one a task
        (2, 300, 4, 2, 64),  # runs of two blocks, the last run empty
    ],
)
def test_prefill_attention_matches_sdpa(
    count: int, length: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype
) -> None:
    # q, k, v as slices of one packed projection (strided), as the layers pass them.
    tokens = count * length
    gen = torch.Generator().manual_seed(length)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    out = torch.full((tokens + 2, heads, dim), 7.0, dtype=dtype)
    fused_ops.prefill_attention(q, k, v, out[1:-1], count)
    exact = _sdpa_prompts(q.double(), k.double(), v.double(), count)
    error = (out[1:-1].double() - exact).abs().max().item()
    sdpa_error = (_sdpa_prompts(q, k, v, count).double() - exact).abs().max().item()
    assert error <= 1.5 * sdpa_error + PREFILL_SLACK[dtype]  # as close as PyTorch's kernel
    assert (out[0] == 7.0).all() and (out[-1] == 7.0).all()  # its rows only


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
@pytest.mark.parametrize(
    ("count", "length", "context", "heads", "kv_heads", "dim"),
    [
        (1, 530, 32, 9, 3, 64),  # a chat prompt after a cached system prompt
        (1, 1, 47, 4, 2, 64),  # one query after an odd context
        (2, 70, 20, 8, 8, 128),
        (1, 300, 900, 2, 1, 64),  # a long prompt's later chunk: runs of blocks
    ],
)
def test_prefill_attention_after_a_context_matches_sdpa(
    count: int, length: int, context: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(length + context)
    keys = context + length
    q = torch.randn(count * length, heads, dim, generator=gen).to(dtype)
    # Gathered from the cache: whole rows, contiguous, as ``Attention._gather`` returns.
    k, v = (torch.randn(count * keys, kv_heads, dim, generator=gen).to(dtype)
            for _ in range(2))  # fmt: skip
    out = torch.full((count * length, heads, dim), 7.0, dtype=dtype)
    fused_ops.prefill_attention(q, k, v, out, count)
    exact = _sdpa_prompts(q.double(), k.double(), v.double(), count)
    error = (out.double() - exact).abs().max().item()
    sdpa_error = (_sdpa_prompts(q, k, v, count).double() - exact).abs().max().item()
    assert error <= 1.5 * sdpa_error + PREFILL_SLACK[dtype]


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
def test_prefill_attention_refuses_what_it_is_not_built_for(dtype: torch.dtype) -> None:
    q, kv = torch.randn(8, 2, 64).to(dtype), torch.randn(8, 1, 64).to(dtype)
    with pytest.raises(RuntimeError, match="bfloat16 or float32 only"):
        fused_ops.prefill_attention(q.half(), kv.half(), kv.half(), q.half(), 1)
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(RuntimeError, match="in one dtype"):
        fused_ops.prefill_attention(q, kv.to(other), kv.to(other), q.clone(), 1)
    with pytest.raises(RuntimeError, match="head dim 64 or 128"):
        odd = torch.randn(8, 2, 96).to(dtype)
        fused_ops.prefill_attention(odd, odd[:, :1], odd[:, :1], odd.clone(), 1)
    with pytest.raises(RuntimeError, match="count prompts of one length"):
        fused_ops.prefill_attention(q, kv, kv, q.clone(), 3)
    with pytest.raises(RuntimeError, match="as long as its prompt's queries or longer"):
        fused_ops.prefill_attention(q, kv[:6], kv[:6], q.clone(), 1)


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
def test_a_runner_attends_prompts_and_context_chunks_with_the_kernel(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    # head dim 64 (the tiny Llama's is 16): 2 query heads over 1 KV head.
    path = build_tiny_llama(tmp_path, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    runner = ModelRunner(path, num_kv_blocks=32, block_size=4, dtype=str(dtype).split(".")[-1])
    attentions = [m for m in runner.model.modules() if isinstance(m, Attention)]
    assert attentions and all(dtype in m.native_prefill_dtypes for m in attentions)
    # Two prompts of 6 (one run), one of 5 (a run alone), then a chunk with cached context.
    first = [
        SeqChunk((5, 6, 7, 8, 9, 10), 0, (0, 1), True),
        SeqChunk((11, 12, 13, 14, 15, 16), 0, (2, 3), True),
        SeqChunk((17, 18, 19, 20, 21), 0, (4, 5), True),
    ]
    later = [SeqChunk((22, 23, 24), 5, (4, 5), True)]

    def logits(native: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
        for module in attentions:
            module.native_prefill_dtypes = frozenset({dtype} if native else ())
        with torch.profiler.profile() as profiled:
            step = runner.execute(first), runner.execute(later)
        calls = [e.name for e in profiled.events()].count("conveyor_native::prefill_attention")
        return *step, calls

    *kernel, calls = logits(True)
    *sdpa, no_calls = logits(False)
    # Three calls a layer: the run of two, the prompt alone, the chunk after its context.
    assert calls == 3 * runner.config.num_layers and no_calls == 0
    close = {"atol": 0.1, "rtol": 0.05} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    for got, expected in zip(kernel, sdpa, strict=True):
        torch.testing.assert_close(got, expected, **close)


@needs_prefill_kernel
@pytest.mark.parametrize(("window", "uses_kernel"), [(None, True), (8, True), (6, False)])
def test_a_context_chunk_goes_to_the_kernel_unless_a_window_hides_keys(
    tmp_path: Path, window: int | None, uses_kernel: bool
) -> None:
    path = build_tiny_llama(tmp_path, hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    runner = ModelRunner(path, num_kv_blocks=32, block_size=4, dtype="bfloat16")
    attentions = [m for m in runner.model.modules() if isinstance(m, Attention)]
    runner.execute([SeqChunk((5, 6, 7, 8, 9), 0, (0, 1), True)])
    for module in attentions:
        module.window = window  # the chunk's queries sit at 5..7: a window of 6 hides key 0
    with torch.profiler.profile() as profiled:
        runner.execute([SeqChunk((10, 11, 12), 5, (0, 1), True)])
    calls = [e.name for e in profiled.events()].count("conveyor_native::prefill_attention")
    assert calls == (runner.config.num_layers if uses_kernel else 0)
