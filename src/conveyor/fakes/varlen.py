"""Torch stand-ins for flash-attn's and FlashInfer's varlen paged attention, for CPU tests.

Each follows its library's documented contract, checks what the library would refuse
(index dtypes, shapes, page sizes, lengths), and computes the attention in float32 from
the cache itself, one sequence at a time: slow and plain, so that the adapters in
``varlen_kernels`` can run a real model on a CPU and be compared with Conveyor's own
attention. They stand in for the libraries; they are not a backend.

- flash-attn 2.5+: ``flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q,
  cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size,
  block_table)``; pages of a multiple of 256 tokens; causal from the bottom right; a
  window ``(left, right)`` keeps keys ``[p - left, p + right]`` of the query at ``p``.
- FlashInfer: ``BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")``, ``plan(qo_indptr,
  paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
  head_dim, page_size, causal=, window_left=, q_data_type=, kv_data_type=)`` then
  ``run(q, (k_cache, v_cache))``; ``1 <= last_page_len <= page_size``. And
  ``BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=, paged_kv_*_buffer=)``
  with ``plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
  page_size, window_left=, q_data_type=, kv_data_type=)``: one query a sequence.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.layers.varlen_kernels import (
    FlashAttnVarlen,
    FlashInferVarlen,
    KernelShape,
    kernel_shape,
)

__all__ = [
    "checkpoint_stand_in",
    "flash_attn_module",
    "flashinfer_module",
    "reference_paged_attention",
    "stand_in_kernel",
]


def reference_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start: Sequence[int],
    tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    window_left: int,
) -> torch.Tensor:
    """Each sequence's queries against its pages, causal from the bottom right, keys more
    than ``window_left`` before a query hidden (-1: none); float32 inside, ``q``'s dtype out."""
    out = torch.empty_like(q)
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_cache.shape[2]
    for index, table in enumerate(tables):
        start, end, length = query_start[index], query_start[index + 1], context_lens[index]
        pages = torch.tensor(list(table), dtype=torch.int64)
        keys = k_cache[pages].flatten(0, 1)[:length].float().repeat_interleave(group, dim=1)
        values = v_cache[pages].flatten(0, 1)[:length].float().repeat_interleave(group, dim=1)
        query_pos = torch.arange(length - (end - start), length)[:, None]
        key_pos = torch.arange(length)[None, :]
        visible = key_pos <= query_pos
        if window_left >= 0:
            visible &= key_pos >= query_pos - window_left
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), keys) * head_dim**-0.5
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    assert out.shape[1] == num_heads
    return out


def _check(condition: bool, message: str) -> None:
    """Refuse as the library would."""
    if not condition:
        raise RuntimeError(message)


def _int32(tensor: torch.Tensor, name: str) -> list[Any]:
    """An index tensor's values, refused unless int32 as both libraries want."""
    _check(tensor.dtype == torch.int32, f"{name} must have dtype torch.int32")
    values: list[Any] = tensor.tolist()
    return values


def _flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """flash-attn's varlen function, paged form only (``block_table`` given). A batch of
    one query a sequence is computed by tensor ops alone (no host sync), so that a CUDA
    graph can capture it; the rest reads the lengths on the host."""
    _check(block_table is not None, "this stand-in covers the paged form only")
    assert block_table is not None
    _check(k.shape[1] % 256 == 0, "Paged KV cache block size must be divisible by 256")
    _check(q.dtype == k.dtype == v.dtype, "query and key must have the same dtype")
    _check(causal and dropout_p == 0.0, "the adapter must ask for causal inference")
    _check(window_size[1] in (-1, 0), "no keys after the query")
    _check(softmax_scale in (None, q.shape[-1] ** -0.5), "the default softmax scale")
    _check(cu_seqlens_k.dtype == block_table.dtype == torch.int32, "int32 indices")
    if max_seqlen_q == 1:
        return _one_query_each(q, k, v, cu_seqlens_k, block_table, window_size[0])
    q_start, k_start = _int32(cu_seqlens_q, "cu_seqlens_q"), _int32(cu_seqlens_k, "cu_seqlens_k")
    tables = _int32(block_table, "block_table")
    _check(q.shape[0] == q_start[-1], "total_q must equal cu_seqlens_q[-1]")
    lengths = [b - a for a, b in itertools.pairwise(k_start)]
    q_lengths = [b - a for a, b in itertools.pairwise(q_start)]
    _check(max(q_lengths) <= max_seqlen_q and max(lengths) <= max_seqlen_k, "max_seqlen")
    _check(len(tables) == len(lengths), "block_table must have batch_size rows")
    page = k.shape[1]
    used = [table[: -(-length // page)] for table, length in zip(tables, lengths, strict=True)]
    return reference_paged_attention(q, k, v, q_start, used, lengths, window_size[0])


def _one_query_each(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    block_table: torch.Tensor,
    window_left: int,
) -> torch.Tensor:
    """Each row's query (the last position of its context) against its whole padded
    table, keys past its length hidden: fixed shapes, no host reads."""
    group = q.shape[1] // k_cache.shape[2]
    lengths = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).long()
    tables = block_table.long()
    keys = k_cache[tables].flatten(1, 2).float().repeat_interleave(group, dim=2)
    values = v_cache[tables].flatten(1, 2).float().repeat_interleave(group, dim=2)
    key_pos = torch.arange(keys.shape[1], device=q.device)[None, :]
    query_pos = (lengths - 1)[:, None]
    visible = key_pos <= query_pos
    if window_left >= 0:
        visible &= key_pos >= query_pos - window_left
    scores = torch.einsum("bhd,blhd->bhl", q.float(), keys) * q.shape[-1] ** -0.5
    probs = scores.masked_fill(~visible[:, None, :], float("-inf")).softmax(-1)
    return torch.einsum("bhl,blhd->bhd", probs, values).to(q.dtype)


def flash_attn_module() -> SimpleNamespace:
    """A stand-in for the ``flash_attn`` module (``flash_attn_varlen_func`` only)."""
    return SimpleNamespace(flash_attn_varlen_func=_flash_attn_varlen_func)


class _PrefillWrapper:
    """``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` for the ``NHD`` layout."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        _check(kv_layout == "NHD", "the stand-in covers the NHD layout only")
        _check(float_workspace_buffer.dtype == torch.uint8, "workspace must be uint8")
        self.plan_args: dict[str, Any] | None = None
        self.num_plans = 0

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        *,
        causal: bool = False,
        window_left: int = -1,
        q_data_type: torch.dtype = torch.float16,
        kv_data_type: torch.dtype | None = None,
    ) -> None:
        """Check and keep the batch's layout."""
        q_start, page_start = _int32(qo_indptr, "qo_indptr"), _int32(paged_kv_indptr, "indptr")
        pages, last = _int32(paged_kv_indices, "indices"), _int32(paged_kv_last_page_len, "last")
        _check(causal, "the adapter must ask for causal attention")
        _check(len(q_start) == len(page_start) == len(last) + 1, "batch sizes disagree")
        _check(page_start[-1] == len(pages), "paged_kv_indptr[-1] must be len(indices)")
        _check(all(1 <= n <= page_size for n in last), "1 <= last_page_len <= page_size")
        _check(num_qo_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads")
        tables = [pages[a:b] for a, b in itertools.pairwise(page_start)]
        lengths = [(len(t) - 1) * page_size + n for t, n in zip(tables, last, strict=True)]
        self.plan_args = {
            "q_start": q_start, "tables": tables, "lengths": lengths, "window_left": window_left,
            "heads": (num_qo_heads, num_kv_heads, head_dim_qk), "page_size": page_size,
            "dtypes": (q_data_type, kv_data_type or q_data_type),
        }  # fmt: skip
        self.num_plans += 1

    def run(
        self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """Attend as planned."""
        _check(self.plan_args is not None, "plan() must run before run()")
        assert self.plan_args is not None
        plan = self.plan_args
        k_cache, v_cache = paged_kv_cache
        num_heads, num_kv_heads, head_dim = plan["heads"]
        _check(q.is_contiguous(), "q must be contiguous")
        _check(q.shape[1:] == (num_heads, head_dim), "q's heads disagree with the plan")
        _check(q.shape[0] == plan["q_start"][-1], "q's rows disagree with qo_indptr")
        _check(k_cache.shape[1:] == (plan["page_size"], num_kv_heads, head_dim), "NHD pages")
        _check((q.dtype, k_cache.dtype) == plan["dtypes"], "dtypes disagree with the plan")
        return reference_paged_attention(
            q, k_cache, v_cache, plan["q_start"], plan["tables"], plan["lengths"],
            plan["window_left"],
        )  # fmt: skip


class _DecodeWrapper:
    """``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` (``NHD``): one query a sequence.

    With ``use_cuda_graph`` the batch size is fixed by the buffers, ``plan`` copies the
    pages into them, and ``run`` reads the pages from them when it runs (as the kernel
    does in a replayed graph), not from what was planned.
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
    ) -> None:
        _check(kv_layout == "NHD", "the stand-in covers the NHD layout only")
        buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        _check(all(b is not None for b in buffers) == use_cuda_graph, "buffers iff graphs")
        self._buffers = buffers
        self._pages: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._plan: dict[str, Any] | None = None

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        window_left: int = -1,
        q_data_type: torch.dtype = torch.float16,
        kv_data_type: torch.dtype | None = None,
    ) -> None:
        """Check the batch; in graph mode copy its pages into the buffers."""
        page_start, last = _int32(indptr, "indptr"), _int32(last_page_len, "last_page_len")
        _check(page_start[-1] == len(_int32(indices, "indices")), "indptr[-1] == len(indices)")
        _check(all(1 <= n <= page_size for n in last), "1 <= last_page_len <= page_size")
        indptr_buffer, indices_buffer, last_buffer = self._buffers
        if indptr_buffer is not None and indices_buffer is not None and last_buffer is not None:
            _check(len(page_start) == len(indptr_buffer), "graph mode fixes the batch size")
            indptr_buffer.copy_(indptr)
            indices_buffer[: len(indices)].copy_(indices)
            last_buffer.copy_(last_page_len)
            self._pages = (indptr_buffer, indices_buffer, last_buffer)
        else:
            self._pages = (indptr.clone(), indices.clone(), last_page_len.clone())
        self._plan = {
            "heads": (num_qo_heads, num_kv_heads, head_dim), "page_size": page_size,
            "window_left": window_left, "dtypes": (q_data_type, kv_data_type or q_data_type),
        }  # fmt: skip

    def run(
        self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """Attend the batch's one query each, reading the pages as they are now."""
        _check(self._plan is not None and self._pages is not None, "plan() before run()")
        assert self._plan is not None and self._pages is not None
        k_cache, v_cache = paged_kv_cache
        page_size = self._plan["page_size"]
        indptr, indices, last = (tensor.tolist() for tensor in self._pages)
        _check(q.shape[0] == len(last), "q must have one row per sequence")
        _check(q.shape[1:] == self._plan["heads"][::2], "q's heads disagree with the plan")
        _check((q.dtype, k_cache.dtype) == self._plan["dtypes"], "dtypes disagree with the plan")
        tables = [indices[a:b] for a, b in itertools.pairwise(indptr)]
        lengths = [(len(t) - 1) * page_size + n for t, n in zip(tables, last, strict=True)]
        return reference_paged_attention(
            q, k_cache, v_cache, range(len(last) + 1), tables, lengths, self._plan["window_left"]
        )


def flashinfer_module() -> SimpleNamespace:
    """A stand-in for the ``flashinfer`` module (the paged prefill and decode wrappers)."""
    return SimpleNamespace(
        BatchPrefillWithPagedKVCacheWrapper=_PrefillWrapper,
        BatchDecodeWithPagedKVCacheWrapper=_DecodeWrapper,
    )


def stand_in_kernel(name: str, shape: KernelShape) -> FlashInferVarlen | FlashAttnVarlen:
    """Conveyor's adapter for ``name`` (``flashinfer`` or ``flash_attn``) over its
    stand-in: the real adapter code, the library replaced."""
    if name == "flashinfer":
        return FlashInferVarlen(flashinfer_module(), shape)
    return FlashAttnVarlen(flash_attn_module(), shape)


def checkpoint_stand_in(
    checkpoint_dir: str | Path, block_size: int, name: str
) -> FlashInferVarlen | FlashAttnVarlen:
    """``stand_in_kernel`` shaped for the checkpoint in ``checkpoint_dir`` served on the CPU
    in float32 with blocks of ``block_size``."""
    config = DecoderConfig.from_hf(load_hf_config(checkpoint_dir))
    shape = kernel_shape(config, block_size, torch.float32, torch.device("cpu"))
    return stand_in_kernel(name, shape)
