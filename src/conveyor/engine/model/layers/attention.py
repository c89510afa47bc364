"""Grouped-query self-attention over the paged KV cache.

Each layer's cache is a pair of tensors ``[num_blocks, block_size, num_kv_heads,
head_dim]``; attention writes the step's keys and values into their slots first, then
reads each sequence's context back out of them a whole block at a time (one contiguous
copy per block, not one per token). Decode rows are read in buckets of similar context
length, so each row costs about its own context, not the step's longest. Where a varlen
kernel is installed (``varlen_kernels``, on a GPU), ``attend`` writes the keys and values
the same way and hands the whole step to it instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.layers import fused_ops
from conveyor.engine.model.layers.linear import Linear
from conveyor.engine.model.layers.norm import RMSNorm
from conveyor.engine.model.layers.rotary import apply_rope
from conveyor.engine.model.step_inputs import (
    AttentionMasks,
    DecodeBatch,
    DecodeBucket,
    PrefillSpan,
    StepInput,
    window_hides_keys,
)

if TYPE_CHECKING:
    from conveyor.engine.model.layers.native_kernels import NativeDecodeAttention
    from conveyor.engine.model.layers.paged_attention import CompiledDecodeAttention
    from conveyor.engine.model.layers.varlen_kernels import VarlenKernel

__all__ = ["Attention", "decode_attention", "grouped_attention"]


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    can_repeat_kv: bool | None = None,
) -> torch.Tensor:
    """SDPA over [B, heads, len, dim] with fewer KV heads; causal when ``mask`` is None.

    ``can_repeat_kv`` (default: on CUDA) lets a masked call repeat KV heads to match the
    query heads.
    """
    if can_repeat_kv is None:
        can_repeat_kv = q.device.type == "cuda"
    num_groups = q.shape[-3] // k.shape[-3]
    if num_groups > 1 and mask is not None and can_repeat_kv:
        # On CUDA only the flash and math kernels take grouped heads, and flash takes no
        # mask: repeating KV heads lets the memory-efficient kernel run instead of the math
        # one, which would materialise every score in float32. On CPU grouped heads with a
        # mask are fast as they are, and repeating measured slower.
        k = k.repeat_interleave(num_groups, dim=-3)
        v = v.repeat_interleave(num_groups, dim=-3)
        num_groups = 1
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=num_groups > 1
    )


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query per row over keys and values as gathered, [B, len, kv_heads, dim].

    ``q`` is [B, heads, 1, dim] and ``mask`` additive [B, 1, 1, len] (or None). The CPU's
    fused SDPA kernel is built for long queries: for a single query in bfloat16 it measured
    19x slower than two batched matmuls (7.2 ms against 0.38 ms for 16 rows of SmolLM2's
    208-key context). Keys and values are read where the gather put them: each matmul
    takes a row's ``len * kv_heads`` key (value) rows as one contiguous matrix and
    scores every query head against every KV head, and the scores of the right pairs are
    picked after (the probabilities are spread back the same way). That wastes
    ``kv_heads``-fold arithmetic on a tiny product, and saves transposing the keys and
    values into [B, kv_heads, len, dim] copies, which cost more (27 % of the call for 64
    rows). Scores are softmaxed in float32, as SDPA does.
    """
    batch, num_heads, _, head_dim = q.shape
    length, num_kv_heads = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    queries = q.reshape(batch, num_heads, head_dim) * head_dim**-0.5
    # [B, len * kv_heads, heads]: key (t, j) against every query head h = (group j', i).
    every_pair = torch.bmm(k.reshape(batch, length * num_kv_heads, head_dim), queries.mT)
    pairs = every_pair.view(batch, length, num_kv_heads, num_kv_heads, group)
    # Keep j == j': [B, len, group, kv_heads] -> [B, kv_heads, group, len].
    scores = pairs.diagonal(dim1=2, dim2=3).permute(0, 3, 2, 1).to(torch.float32)
    if mask is not None:
        scores = scores + mask.view(mask.shape[0], 1, 1, length)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    # Each query head's probabilities on its own KV head's values, zero on the others.
    spread = probs.new_zeros(batch, num_kv_heads, group, length, num_kv_heads)
    spread.diagonal(dim1=1, dim2=4).copy_(probs.permute(0, 2, 3, 1))
    values = v.reshape(batch, length * num_kv_heads, head_dim)
    out = torch.bmm(spread.view(batch, num_heads, length * num_kv_heads), values)
    return out.view(batch, num_heads, 1, head_dim)


class Attention(nn.Module):
    """Grouped-query self-attention that writes to and reads from the paged KV cache."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.split_sizes = (config.q_size, config.kv_size, config.kv_size)
        self.qkv_proj = Linear(
            config.hidden_size,
            config.q_size + 2 * config.kv_size,
            bias=config.has_qkv_bias,
            device=device,
            dtype=dtype,
        )
        self.o_proj = Linear(
            config.q_size, config.hidden_size, bias=config.has_o_bias, device=device, dtype=dtype
        )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.has_qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device=device, dtype=dtype)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, device=device, dtype=dtype)
        # Decode buckets read the cache in place through this, where set (see
        # native_kernels, paged_attention).
        self.paged_decode: NativeDecodeAttention | CompiledDecodeAttention | None = None
        # Conveyor's fused CPU rotation (``native_kernels``) for eager steps, where installed.
        self.native_rope = False
        # Conveyor's CPU KV write (``native_kernels``): a row copy per token.
        self.native_kv_write = False
        # The dtypes Conveyor's CPU attention of prompts (``native_kernels``) takes here
        # (bfloat16 with AVX512-BF16, float32 with AVX-512 or AVX2); empty: SDPA attends them.
        self.native_prefill_dtypes: frozenset[torch.dtype] = frozenset()
        # Set by ``compiled_layers``: a compiled layer calls ``attend`` as an opaque op.
        self.op_slot: torch.Tensor | None = None
        # The GPU's one call a layer for the whole step (``varlen_kernels``), where
        # installed, with this layer's sliding window.
        self.varlen: VarlenKernel | None = None
        self.window: int | None = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        step: StepInput,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        masks: AttentionMasks,
    ) -> torch.Tensor:
        """Attend for all T tokens of the step; returns [T, hidden]."""
        q, k, v = self.project(x, rope)
        projected: torch.Tensor = self.o_proj(self.attend(q, k, v, step, kv_cache, masks))
        return projected

    def project(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [T, heads, head_dim] of ``x``, normed and rotated."""
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        q_size, kv_size, _ = self.split_sizes
        num_qk_heads = self.num_heads + self.num_kv_heads
        v = qkv[:, q_size + kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qkv[:, : q_size + kv_size].split((q_size, kv_size), dim=-1)
            q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
            qk = torch.cat((q, k), dim=1)
        else:
            qk = qkv[:, : q_size + kv_size].view(num_tokens, num_qk_heads, self.head_dim)
        # Queries and keys rotated together: one op each, and compiled, one buffer that
        # the attention reads (not the rotation redone inside its loop over the keys).
        cos, sin = rope
        if fused_ops.eager_native(self.native_rope):
            rotated = fused_ops.rope(qk, cos, sin)
        else:
            rotated = apply_rope(qk, cos, sin)
        return rotated[:, : self.num_heads], rotated[:, self.num_heads :], v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        step: StepInput,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        masks: AttentionMasks,
    ) -> torch.Tensor:
        """Write ``k``, ``v`` to the cache and attend; returns [T, heads * head_dim].

        Rows past the step's tokens (``row_buckets``' padding) are neither written nor
        attended, and come out as zeros."""
        num_rows, num_tokens = q.shape[0], step.slot_mapping.shape[0]
        # Flat views: one row per cache slot, so a slot number indexes a row directly.
        k_slots = kv_cache[0].view(-1, self.num_kv_heads, self.head_dim)
        v_slots = kv_cache[1].view(-1, self.num_kv_heads, self.head_dim)
        # Write first: a chunk's own keys must be visible to its own queries.
        self._write_kv((k_slots, v_slots), step.slot_mapping, k[:num_tokens], v[:num_tokens])
        if self.varlen is not None and step.varlen is not None:
            attended = self.varlen(q, kv_cache[0], kv_cache[1], self.window)
            return attended.reshape(num_rows, self.num_heads * self.head_dim)
        # One row per block: a block number gathers a whole block in one copy.
        blocks = (kv_cache[0].flatten(1), kv_cache[1].flatten(1))
        out = torch.empty_like(q)
        out[num_tokens:].zero_()
        for first, count in masks.prefill_runs:
            if masks.prefill[first] is None:  # whole prompts (every run of several is)
                self._attend_prompts(q, k, v, step.prefills[first : first + count], out)
                continue
            self._attend_prefill(q, k, v, step.prefills[first], masks.prefill[first], blocks, out)
        if step.decode is not None:
            decoded = self._attend_decode(q, step.decode, masks.decode, blocks, kv_cache)
            out.index_copy_(0, step.decode.token_indices, decoded)
        return out.view(num_rows, self.num_heads * self.head_dim)

    def _write_kv(
        self,
        slots: tuple[torch.Tensor, torch.Tensor],
        slot_mapping: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """The step's keys and values into their cache slots (flat [slots, kv_heads, dim])."""
        native = fused_ops.eager_native(self.native_kv_write)
        for cache, src in zip(slots, (k, v), strict=True):
            if native and fused_ops.can_write_slots(cache, src):
                fused_ops.write_slots(cache, slot_mapping, src)
            else:
                cache.index_copy_(0, slot_mapping, src)

    def _gather(
        self, blocks: tuple[torch.Tensor, torch.Tensor], tables: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of block tables [..., n] as [..., n * block_size, kv_heads, dim]."""
        shape = (*tables.shape[:-1], -1, self.num_kv_heads, self.head_dim)
        flat = tables.reshape(-1)
        # index_select copies whole rows; plain indexing is far slower on CPU.
        keys = blocks[0].index_select(0, flat).view(shape)
        values = blocks[1].index_select(0, flat).view(shape)
        return keys, values

    def _attend_prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seq: PrefillSpan,
        mask: torch.Tensor | None,
        blocks: tuple[torch.Tensor, torch.Tensor],
        out: torch.Tensor,
    ) -> None:
        """One sequence's chunk against its whole context, into its rows of ``out``.

        A chunk after a cached context is plain causal attention over more keys unless a
        sliding window hides some: the native kernel takes it as it takes whole prompts.
        With SDPA and the mask instead, a SmolLM2 step of a 530-token chunk after a cached
        32-token context took 336-352 ms against 198-213 ms in bfloat16 on 2 threads of
        an AVX512-BF16 EPYC (an ad-hoc run): every chat prompt after the first is such a
        chunk, its chat template's system prompt cached."""
        rows = slice(seq.token_start, seq.token_end)
        if seq.context_blocks is None:
            keys, values = k[rows], v[rows]
        else:
            keys, values = self._gather(blocks, seq.context_blocks)
            keys, values = keys[: seq.end_pos], values[: seq.end_pos]
            if self._runs_native_prefill(q) and not window_hides_keys(self.window, seq.end_pos):
                fused_ops.prefill_attention(q[rows], keys, values, out[rows], 1)
                return
        # [len, heads, dim] -> [1, heads, len, dim] as SDPA expects.
        attended = grouped_attention(
            q[rows].transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            mask,
        )
        out[rows] = attended[0].transpose(0, 1)

    def _runs_native_prefill(self, q: torch.Tensor) -> bool:
        """Whether the native prefill attention takes this step's prompts (their dtype)."""
        return fused_ops.eager_native(q.dtype in self.native_prefill_dtypes)

    def _attend_prompts(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        prompts: tuple[PrefillSpan, ...],
        out: torch.Tensor,
    ) -> None:
        """Whole prompts of one length, back to back in the step, in one causal call;
        writes their rows of ``out``."""
        start, end = prompts[0].token_start, prompts[-1].token_end
        count, length = len(prompts), prompts[0].query_len
        if self._runs_native_prefill(q):
            fused_ops.prefill_attention(
                q[start:end], k[start:end], v[start:end], out[start:end], count
            )
            return

        def batched(x: torch.Tensor) -> torch.Tensor:
            # [count * len, heads, dim] -> [count, heads, len, dim] (a view)
            return x[start:end].view(count, length, x.shape[1], self.head_dim).transpose(1, 2)

        attended = grouped_attention(batched(q), batched(k), batched(v), None)
        out[start:end].view(count, length, self.num_heads, self.head_dim).copy_(
            attended.transpose(1, 2)
        )

    def _attend_decode(
        self,
        q: torch.Tensor,
        decode: DecodeBatch,
        masks: list[torch.Tensor | None],
        blocks: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """All single-token sequences, a bucket per call; returns [B, heads, head_dim]."""
        # [B, heads, dim] -> [B, heads, 1 (query), dim]
        queries = q.index_select(0, decode.token_indices).unsqueeze(2)
        out = torch.empty_like(queries)
        for bucket, mask in zip(decode.buckets, masks, strict=True):
            out[bucket.row_start : bucket.row_end] = self._attend_bucket(
                queries, bucket, mask, blocks, kv_cache
            )
        return out.squeeze(2)

    def _attend_bucket(
        self,
        queries: torch.Tensor,
        bucket: DecodeBucket,
        mask: torch.Tensor | None,
        blocks: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """One bucket of decode rows over their padded block tables."""
        rows = queries[bucket.row_start : bucket.row_end]
        if self.paged_decode is not None and mask is not None:
            tables = bucket.block_tables
            in_place = self.paged_decode(rows.squeeze(2), *kv_cache, tables, mask)
            if in_place is not None:
                return in_place.unsqueeze(2)
        keys, values = self._gather(blocks, bucket.block_tables)
        if rows.device.type == "cpu":
            return decode_attention(rows, keys, values, mask)
        return grouped_attention(rows, keys.transpose(1, 2), values.transpose(1, 2), mask)
