"""Decode attention that reads the paged KV cache in place, compiled by inductor (CPU).

The eager decode path (``attention.decode_attention``) first copies each row's blocks
into one contiguous tensor per bucket (``index_select``), then runs two batched matmuls
over the copy. Here one function states the whole thing over the cache itself — keys
``k_cache[block_tables[b, t // block_size], t % block_size]`` — and ``torch.compile``
fuses the block lookup into the score and value reductions: no copy of the context is
made, and the float32 softmax and dtype casts are fused in.

Shapes are dynamic (rows, blocks per row, cache blocks), so one graph per dtype and head
layout serves every bucket of every step; it is compiled by :meth:`CompiledDecodeAttention.warm_up`
when the runner starts. After that a call never compiles: a call that would (a shape the
graph's guards do not cover) raises inside dynamo, and the caller falls back to the eager
path for it (counted in ``num_fallbacks``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

from conveyor.engine.model.huge_pages import advise_huge_pages
from conveyor.engine.model.layers.attention import Attention

__all__ = [
    "CACHE_OFFSET_ELEMENTS",
    "MIN_COMPILED_SIZE",
    "CompiledDecodeAttention",
    "cache_at_offset",
    "compile_decode_attention",
    "paged_decode_attention",
    "warm_up_sizes",
]

# Dynamo specialises sizes 0 and 1, so rows and blocks per row below this run eager.
MIN_COMPILED_SIZE = 2

# Elements before a cache's first (64 bytes in float32): kept clear of offset 0 or 1.
CACHE_OFFSET_ELEMENTS = 16

# How dynamo's "fail_on_recompile" stance words the RuntimeError it raises.
_RECOMPILE_MESSAGE = "Detected recompile"

# Candidate sizes to trace the graph at (rows, blocks per row): the first pair whose sizes
# differ from each other and from every fixed size of the call (cache blocks, block size,
# heads, head dim), so that no coincidental equality becomes a guard of the graph.
_WARM_UP_ROWS = (7, 11, 13, 17, 19)
_WARM_UP_BLOCKS = (5, 6, 10, 12, 14)


def warm_up_sizes(fixed_sizes: set[int], block_size: int) -> tuple[int, int]:
    """Rows and blocks per row to trace at: no size among them (or the context length they
    make) equal to another or to one of ``fixed_sizes``."""
    for rows in _WARM_UP_ROWS:
        for blocks in _WARM_UP_BLOCKS:
            sizes = {rows, blocks, blocks * block_size}
            if len(sizes) == 3 and not sizes & fixed_sizes:
                return rows, blocks
    raise ValueError(f"no warm-up sizes clear of {sorted(fixed_sizes)}")


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """One query per row against its blocks, read in place; returns [b, heads, dim].

    ``q`` is [b, heads, dim]; the caches [num_blocks, block_size, kv_heads, dim];
    ``block_tables`` [b, n] (int64); ``mask`` additive [b, n, block_size]. Scores
    and softmax are float32, as SDPA computes them. Meant to run compiled: eager, it
    materialises the gathered context in float32.
    """
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    # [b, n, block_size, kv_heads, dim]: indexing, which the compiler fuses into the loads.
    keys = k_cache[block_tables].to(torch.float32)
    values = v_cache[block_tables].to(torch.float32)
    queries = q.view(rows, 1, 1, num_kv_heads, group, head_dim).to(torch.float32)
    scores = (queries * head_dim**-0.5 * keys[..., None, :]).sum(-1)  # [b, n, bs, kv, group]
    scores = scores + mask[..., None, None].to(torch.float32)
    probs = torch.softmax(scores.flatten(1, 2), dim=1)  # [b, n * bs, kv_heads, group]
    out = (probs[..., None] * values.flatten(1, 2)[..., None, :]).sum(1)  # [b, kv, group, dim]
    return out.reshape(rows, num_heads, head_dim).to(q.dtype)


class CompiledDecodeAttention:
    """``paged_decode_attention`` compiled once, with dynamic rows, blocks and cache size."""

    def __init__(self) -> None:
        self._compiled: Callable[..., torch.Tensor] = torch.compile(
            paged_decode_attention, dynamic=False
        )
        self.num_calls = 0
        self.num_fallbacks = 0

    def warm_up(self, k_cache: torch.Tensor, num_heads: int) -> float:
        """Compile for caches shaped and typed like ``k_cache`` (any number of blocks, at a
        storage offset of at least ``MIN_COMPILED_SIZE`` elements: see
        ``cache_at_offset``) and ``num_heads`` query heads; returns the compile seconds."""
        started_s = time.perf_counter()
        _, block_size, num_kv_heads, head_dim = k_cache.shape
        fixed = {block_size, num_kv_heads, head_dim, num_heads, num_heads // num_kv_heads}
        rows, width = warm_up_sizes(fixed, block_size)
        num_blocks = rows * width + 1
        device, dtype = k_cache.device, k_cache.dtype
        # The caches outside inference mode and the step's tensors inside it, as the
        # runner makes them: a guard tells the two kinds apart.
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k_warm, v_warm = cache_at_offset((2, *shape), dtype, device).unbind()  # unequal offsets
        with torch.inference_mode():
            q = torch.zeros(rows, num_heads, head_dim, dtype=dtype, device=device)
            tables = torch.arange(rows * width, device=device).view(rows, width)
            mask = torch.zeros(rows, width, block_size, dtype=dtype, device=device)
            # Only these sizes vary: head counts and sizes stay fixed, so the kernels are
            # generated for them (vectorised over the head dimension).
            for tensor in (q, k_warm, v_warm, tables, mask):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
            torch._dynamo.maybe_mark_dynamic(tables, 1)
            torch._dynamo.maybe_mark_dynamic(mask, 1)
            self._call(q, k_warm, v_warm, tables, mask, stance="default")
        return time.perf_counter() - started_s

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor | None:
        """The attention output (``mask`` additive, [b, 1, 1, n * block_size]), or None
        where the compiled graph does not cover the call (fewer than ``MIN_COMPILED_SIZE``
        rows or blocks, or a call it would recompile for): the caller then runs eager."""
        if min(block_tables.shape) < MIN_COMPILED_SIZE:
            return None
        self.num_calls += 1
        try:
            mask = mask.view(*block_tables.shape, k_cache.shape[1])
            return self._call(q, k_cache, v_cache, block_tables, mask, stance="fail_on_recompile")
        except RuntimeError as error:
            if not str(error).startswith(_RECOMPILE_MESSAGE):
                raise
            self.num_fallbacks += 1
            return None

    def _call(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        mask: torch.Tensor,
        *,
        stance: str,
    ) -> torch.Tensor:
        """Run the compiled function under ``stance`` (contiguous query rows)."""
        q = q.contiguous()
        with torch.compiler.set_stance(stance):
            return self._compiled(q, k_cache, v_cache, block_tables, mask)


def cache_at_offset(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A zeroed tensor that starts ``CACHE_OFFSET_ELEMENTS`` into its storage.

    Dynamo specialises a storage offset of 0 (or 1): a graph traced on one layer's cache
    view at offset 0 would not serve the other layers' views, and one traced on an offset
    would not serve offset 0. Every view of a cache allocated here has an offset of at least
    ``CACHE_OFFSET_ELEMENTS``, so one graph serves them all. On a Linux CPU its memory is
    advised into transparent huge pages first (``huge_pages``).
    """
    numel = CACHE_OFFSET_ELEMENTS + math.prod(shape)
    flat = torch.empty(numel, dtype=dtype, device=device)
    advise_huge_pages(flat)  # before the first touch: zeroing faults the pages in
    flat.zero_()
    return flat[CACHE_OFFSET_ELEMENTS:].view(shape)


def compile_decode_attention(
    model: nn.Module, kv_cache: tuple[torch.Tensor, torch.Tensor]
) -> tuple[CompiledDecodeAttention, float]:
    """Give every ``Attention`` of ``model`` one compiled in-place decode attention, warmed
    up for caches like ``kv_cache`` (any layer's); returns it and the compile seconds. The
    cache must come from ``cache_at_offset`` (others fall back to the eager path).
    """
    compiled = CompiledDecodeAttention()
    attentions = [module for module in model.modules() if isinstance(module, Attention)]
    if not attentions:
        raise ValueError("the model has no Attention layers")
    seconds = compiled.warm_up(kv_cache[0], num_heads=attentions[0].num_heads)
    for attention in attentions:
        attention.paged_decode = compiled
    return compiled, seconds
