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
  ``run(q, (k_cache, v_cache))``; ``1 <= last_page_len <= page_size``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["flash_attn_module", "flashinfer_module", "reference_paged_attention"]


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
    """flash-attn's varlen function, paged form only (``block_table`` given)."""
    _check(block_table is not None, "this stand-in covers the paged form only")
    assert block_table is not None
    _check(k.shape[1] % 256 == 0, "Paged KV cache block size must be divisible by 256")
    _check(q.dtype == k.dtype == v.dtype, "query and key must have the same dtype")
    _check(causal and dropout_p == 0.0, "the adapter must ask for causal inference")
    _check(window_size[1] in (-1, 0), "no keys after the query")
    _check(softmax_scale in (None, q.shape[-1] ** -0.5), "the default softmax scale")
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


def flashinfer_module() -> SimpleNamespace:
    """A stand-in for the ``flashinfer`` module (the paged prefill wrapper only)."""
    return SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=_PrefillWrapper)
