"""A projection whose weights come from the checkpoint, never from a random init."""

from __future__ import annotations

import functools
import logging
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from conveyor.engine.model.layers.opaque_ops import linear_op

logger = logging.getLogger(__name__)

__all__ = [
    "PACKED_DTYPES",
    "PACK_ROWS_HINT",
    "Linear",
    "bfloat16_packing_supported",
    "empty_param",
    "packed_weight",
    "prepack_projections",
]

# The row count oneDNN chooses a packed weight's layout for (any count works): a decode
# step's batch.
PACK_ROWS_HINT = 16
# The dtypes ``Linear.prepack`` packs on the CPU (float16 keeps ``F.linear``).
PACKED_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def bfloat16_packing_supported() -> bool:
    """Whether oneDNN packs bfloat16 weights on this CPU (it needs AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT; an AVX2-only CPU refuses, and ``F.linear`` serves it)."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def _warn_unpacked_bfloat16() -> None:
    """Say once why bfloat16 projections are slow here, and what is faster."""
    logger.warning(
        "this CPU has no native bfloat16 (oneDNN cannot pack bfloat16 weights for it): "
        "bfloat16 projections run several times slower than float32 here; dtype: auto "
        "(float32 on the CPU) is faster"
    )


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A oneDNN-blocked copy of ``weight`` [out, in] for ``mkldnn._linear_pointwise``, or
    None where oneDNN does not pack it (not the CPU, float16, bfloat16 on a CPU without
    native bfloat16, no oneDNN)."""
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES:
        return None
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return None
    if weight.dtype == torch.bfloat16 and not bfloat16_packing_supported():
        _warn_unpacked_bfloat16()
        return None
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
        weight.detach().contiguous(), PACK_ROWS_HINT
    )
    return packed


def empty_param(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised parameter: every value is overwritten from the checkpoint."""
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """``y = x W^T + b`` with weights left uninitialised (random init of a big model is slow)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.out_features = out_features
        self.weight = empty_param(out_features, in_features, device=device, dtype=dtype)
        self.bias = empty_param(out_features, device=device, dtype=dtype) if bias else None
        self.packed: torch.Tensor | None = None
        # Set by ``compiled_layers``: a compiled graph calls this projection as an opaque op.
        self.op_slot: torch.Tensor | None = None

    def prepack(self, *, release: bool = False) -> bool:
        """Keep a oneDNN-blocked copy of the weight for ``forward`` (CPU; float32, and
        bfloat16 where the CPU packs it).

        Call it once the weight is loaded (and again if it changes). Other devices and
        dtypes, and bfloat16 on CPUs oneDNN cannot pack it for, keep ``F.linear``; returns
        whether a packed copy is now in use. ``release`` then frees the unpacked weight
        (leaving it empty), for a weight no other module shares; packing again after that
        keeps the packed copy. ``bench.decode_step`` measures what packing gains.
        """
        weight = self.weight
        if weight.numel() == 0:
            # Packed already and the unpacked weight let go; or let go by its owner
            # (``MLP.fuse_activation``), with nothing to pack.
            return self.packed is not None
        self.packed = packed_weight(weight)
        if self.packed is None:
            return False
        if release:
            self.weight = empty_param(0, device=weight.device, dtype=weight.dtype)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the projection."""
        if self.op_slot is not None and torch.compiler.is_compiling():
            traced: torch.Tensor = linear_op(x, self.op_slot, self.out_features)
            return traced
        return self.eager_forward(x)

    def eager_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the projection without going through an op (what ``linear_op`` runs)."""
        if self.packed is not None:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x, self.packed, self.bias, "none", [], ""
            )
            return out
        return F.linear(x, self.weight, self.bias)


def prepack_projections(model: nn.Module) -> int:
    """``Linear.prepack`` every projection of ``model``, freeing the unpacked weights no
    other module shares (a tied output projection keeps the embedding's); returns how
    many projections are packed."""
    owners = Counter(id(param) for _, param in model.named_parameters(remove_duplicate=False))
    modules = [m for m in model.modules() if isinstance(m, Linear)]
    return sum(m.prepack(release=owners[id(m.weight)] == 1) for m in modules)
