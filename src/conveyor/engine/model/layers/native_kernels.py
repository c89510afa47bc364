"""Conveyor's own CPU kernels (C++ beside this module), built by the machine's compiler, cached.

The decode attention kernel (``native/decode_attention.cpp``) reads each row's keys and
values where they lie in the paged cache, the rows spread over torch's intra-op threads,
and registers itself as the op ``conveyor_native::decode_attention`` (opaque to
``torch.compile``, which calls it from a compiled decoder layer as it is). The fused
RMSNorm (alone, or with the residual add before it), SiLU-and-multiply and rotary
embedding (``native/elementwise.cpp``) serve eager steps only (``fused_ops``): one pass
over each row instead of an intermediate tensor per PyTorch op; so does the KV write
(``native/kv_write.cpp``), a row copy per token. The prefill attention
(``native/prefill_attention.cpp``) attends a step's whole prompts of one length in
bfloat16 through torch's brgemm (AMX or AVX512-BF16), where the CPU has AVX512-BF16 and
the kernel's answer on a small case checks out once; elsewhere SDPA does.

The library is compiled once per set of sources, torch build, compiler and CPU
(``native_build``: about half a minute on two cores) into ``$CONVEYOR_KERNEL_CACHE``
(default ``~/.cache/conveyor/kernels``), then loaded from there. Where it cannot be built
(no compiler, a failed build) the runner keeps the PyTorch path and says so once in the
log; ``native_kernels: false`` in a model's config turns it off. ``python -m
conveyor.engine.model.layers.native_kernels`` builds it ahead (``make test`` does, so that
no test's own time limit has to cover a build).
"""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
import threading
from pathlib import Path

import torch
from torch import nn

from conveyor.engine.model.layers.native_build import build_library, library_path

__all__ = [
    "PREFILL_DTYPES",
    "PREFILL_HEAD_DIMS",
    "NativeDecodeAttention",
    "install_native_kernels",
    "native_decode_attention",
    "native_library",
    "prefill_attention_runs",
]

log = logging.getLogger(__name__)

NATIVE_DIR = Path(__file__).with_name("native")
SOURCES = (
    NATIVE_DIR / "decode_attention.cpp",
    NATIVE_DIR / "elementwise.cpp",
    NATIVE_DIR / "kv_write.cpp",
    NATIVE_DIR / "prefill_attention.cpp",
)
OP_NAME = "conveyor_native::decode_attention"
# Head dims the prefill attention kernel (``native/prefill_attention.cpp``) is built for.
PREFILL_HEAD_DIMS = (64, 128)
# The dtypes it is built for (each where the CPU has the instructions for it).
PREFILL_DTYPES = (torch.bfloat16, torch.float32)
# The prefill attention's largest error allowed against float32 on its one-time check (its
# error there is about 0.01, bfloat16 rounding; a wrong kernel is off by the values' scale).
PREFILL_CHECK_TOLERANCE = 0.05

_LOADING = threading.Lock()


def native_library() -> Path | None:
    """Build (once) and load the kernels; the library's path, or None where they cannot be
    built or loaded here (logged once, with the reason). Models loading on several threads
    at once wait for the first."""
    with _LOADING:
        return _load_once()


@functools.cache
def _load_once() -> Path | None:
    """``native_library`` without the lock: the first call builds and loads, later ones
    return its answer."""
    try:
        path = library_path(SOURCES)
        if not path.exists():
            build_library(SOURCES, path)
        torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
        torch.library.register_fake(OP_NAME)(_fake_decode_attention)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("Conveyor's native CPU kernels are off (PyTorch path instead): %s", error)
        return None
    return path


def _fake_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The op's output as ``torch.compile`` traces it: [rows, heads, dim], like ``q``."""
    return q.new_empty(q.shape)


class NativeDecodeAttention:
    """The native kernel as an ``Attention.paged_decode``: it takes every decode bucket."""

    def __init__(self) -> None:
        self.num_calls = 0

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Attention of ``q`` [b, heads, dim] over its rows' blocks; ``mask`` additive, any
        shape of b x n x block_size elements (0: attend, -inf: hidden)."""
        self.num_calls += 1
        mask = mask.reshape(*block_tables.shape, k_cache.shape[1])
        return native_decode_attention(q, k_cache, v_cache, block_tables, mask)


def native_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The op itself, scaled by ``head_dim ** -0.5``; ``mask`` [b, n, block_size]. Callable
    inside a compiled region (the op is opaque to the compiler)."""
    out: torch.Tensor = torch.ops.conveyor_native.decode_attention(
        q, k_cache, v_cache, block_tables, mask, q.shape[-1] ** -0.5
    )
    return out


def install_native_kernels(model: nn.Module) -> NativeDecodeAttention | None:
    """Give every ``Attention`` of ``model`` the native decode attention and rotation (and
    the prefill attention where it runs: ``prefill_attention_runs``, head dim 64 or 128), and
    every ``RMSNorm`` and ``MLP`` their fused kernel; None (and no change) where the
    kernels are not available."""
    from conveyor.engine.model.layers.attention import Attention
    from conveyor.engine.model.layers.mlp import MLP
    from conveyor.engine.model.layers.norm import RMSNorm

    if native_library() is None:
        return None
    native = NativeDecodeAttention()
    prefill = frozenset(d for d in PREFILL_DTYPES if prefill_attention_runs(d))
    for module in model.modules():
        if isinstance(module, Attention):
            module.paged_decode = native
            module.native_rope = True
            module.native_kv_write = True
            if module.head_dim in PREFILL_HEAD_DIMS:
                module.native_prefill_dtypes = prefill
        elif isinstance(module, (RMSNorm, MLP)):
            module.native = True
    return native


@functools.cache
def prefill_attention_runs(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the native prefill attention runs here in ``dtype``: built for it (bfloat16
    where the CPU has AVX512-BF16, float32 where it has AVX-512 or AVX2), and its answer on two
    small prompts within ``PREFILL_CHECK_TOLERANCE`` of float32 SDPA (torch's brgemm must
    take packed bfloat16 operands on this CPU: checked once, not assumed)."""
    if native_library() is None or not torch.ops.conveyor_native.has_prefill_attention(dtype):
        return False
    gen = torch.Generator().manual_seed(0)
    count, length, heads, dim = 2, 40, 2, 64
    q, k, v = (torch.randn(count * length, h, dim, generator=gen) for h in (heads, 1, 1))
    out = torch.empty(count * length, heads, dim, dtype=dtype)
    try:
        torch.ops.conveyor_native.prefill_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), out, count, dim**-0.5
        )
    except RuntimeError as error:
        log.warning("the native prefill attention is off (SDPA instead): %s", error)
        return False

    from conveyor.engine.model.layers.attention import grouped_attention

    def batched(x: torch.Tensor) -> torch.Tensor:
        return x.view(count, length, -1, dim).transpose(1, 2)

    exact = grouped_attention(batched(q), batched(k), batched(v), None)  # float32, causal
    off_by = (batched(out).float() - exact).abs().max().item()
    if off_by > PREFILL_CHECK_TOLERANCE:
        log.warning("the native prefill attention is off (SDPA instead): off by %.3g", off_by)
        return False
    return True


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    built = native_library()
    log.info("native kernels: %s", built or "off")
    sys.exit(0 if built is not None else 1)
