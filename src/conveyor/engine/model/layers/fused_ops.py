"""Conveyor's fused elementwise CPU kernels as the layers call them, and when they run.

The kernels (``native/elementwise.cpp``, built and loaded with the decode attention by
``native_kernels``) make one pass over each row where PyTorch's eager ops write a tensor
per op. They serve eager steps only: under ``torch.compile`` the layers keep PyTorch's ops,
which inductor fuses with their neighbours (a kernel would be an opaque call between them).
``native_kernels.install_native_kernels`` marks the modules that may use them. The KV
write (``native/kv_write.cpp``) is here too: a row copy per token where ``index_copy_``
copied element by element.
"""

from __future__ import annotations

import torch

__all__ = [
    "add_rms_norm",
    "eager_native",
    "prefill_attention",
    "rms_norm",
    "rope",
    "silu_and_mul",
    "write_slots",
]


def eager_native(installed: bool) -> bool:
    """Whether a module with its fused kernel ``installed`` runs it now (eager code)."""
    return installed and not torch.compiler.is_compiling()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x^2) + eps))`` over the last dimension, as ``RMSNorm``."""
    out: torch.Tensor = torch.ops.conveyor_native.rms_norm(x, weight, eps)
    return out


def add_rms_norm(
    residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual + delta`` and its ``rms_norm``, in one pass (the sum rounded as PyTorch's
    add rounds it, then normed as ``RMSNorm`` norms it)."""
    added, normed = torch.ops.conveyor_native.add_rms_norm(residual, delta, weight, eps)
    return added, normed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` over the two halves of the last dimension."""
    out: torch.Tensor = torch.ops.conveyor_native.silu_and_mul(gate_up)
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [T, heads, dim] rotated by ``cos``/``sin`` [T, 1, dim], as ``apply_rope``."""
    out: torch.Tensor = torch.ops.conveyor_native.rope(x, cos, sin)
    return out


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, count: int
) -> None:
    """Causal attention of ``count`` prompts (or chunks) of one length, back to back in
    ``q`` [T, heads, dim], written into ``out`` [T, heads, dim]. ``k``, ``v`` [count x K,
    kv_heads, dim] hold each one's K keys, K >= T / count: a chunk's queries are the last
    of its keys (K > T / count: a cached context before them). Head dim 64 or 128; bfloat16
    on a CPU with AVX512-BF16, float32 on one with AVX-512 or AVX2
    (``native/prefill_attention.cpp``; ``native_kernels.prefill_attention_runs``)."""
    torch.ops.conveyor_native.prefill_attention(q, k, v, out, count, q.shape[-1] ** -0.5)


def can_write_slots(cache: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether ``write_slots`` takes ``src`` [T, heads, dim] into ``cache`` [slots, heads,
    dim]: a contiguous cache, each source row's values contiguous, the same dtype."""
    rows_whole = src.stride(-1) == 1 and src.stride(-2) == src.shape[-1]
    return cache.is_contiguous() and rows_whole and src.dtype == cache.dtype


def write_slots(cache: torch.Tensor, slot_mapping: torch.Tensor, src: torch.Tensor) -> None:
    """``cache[slot_mapping[t]] = src[t]`` for every token t, a row copy each (as
    ``cache.index_copy_(0, slot_mapping, src)``; see ``can_write_slots``)."""
    torch.ops.conveyor_native.write_slots(cache, slot_mapping, src)
