"""A projection whose weights come from the checkpoint, never from a random init."""

from __future__ import annotations

import functools
import logging
import platform
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
    "has_packed_projections",
    "native_bfloat16_dot",
    "packed_weight",
    "packing_dtype",
    "prepack_projections",
]

# The row count oneDNN chooses a packed weight's layout for (any count works): a decode
# step's batch.
PACK_ROWS_HINT = 16
# The dtypes ``Linear.prepack`` packs on the CPU (float16 keeps ``F.linear``).
PACKED_DTYPES = (torch.float32, torch.bfloat16)


# platform.machine() of x86 CPUs, lower-cased.
_X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})


def _onednn_bfloat16() -> bool:
    """Whether oneDNN takes bfloat16 matmuls on this CPU at all (on x86 it asks only for
    AVX-512 BW/VL/DQ or AVX-NE-CONVERT, and emulates the products without AVX512-BF16;
    on Arm it asks for hardware bfloat16)."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def native_bfloat16_dot() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware: AVX512-BF16 or AMX on x86; on
    other CPUs (Arm), oneDNN's own check, which asks for it. Elsewhere oneDNN emulates
    bfloat16 matmuls, several times slower than float32 ones."""
    if platform.machine().lower() in _X86_MACHINES:
        cpu = torch.cpu
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    return _onednn_bfloat16()


@functools.cache
def bfloat16_packing_supported() -> bool:
    """Whether oneDNN packs and multiplies bfloat16 weights as bfloat16 on this CPU: where
    it multiplies them in hardware (``native_bfloat16_dot``). Elsewhere ``packed_weight``
    packs them as float32."""
    return native_bfloat16_dot() and _onednn_bfloat16()


def packing_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The dtype a CPU projection of ``dtype`` weights is packed and multiplied in: float32
    as it is; bfloat16 as it is where the CPU multiplies it in hardware, else float32; None
    (``F.linear``) for float16.

    bfloat16 in float32 is exact where it matters: each bfloat16 is a float32, each product
    of two is exact in float32, the products are summed in float32 as hardware bfloat16 dot
    products sum them, and the output is rounded to bfloat16 once. It costs twice the
    weights' memory, and runs at float32's speed instead of emulated bfloat16's."""
    if dtype not in PACKED_DTYPES:
        return None
    if dtype == torch.bfloat16 and not bfloat16_packing_supported():
        return torch.float32
    return dtype


@functools.cache
def _say_bfloat16_in_float32() -> None:
    """Say once that bfloat16 projections are multiplied in float32 here, and its cost."""
    logger.info(
        "this CPU has no bfloat16 dot products (AVX512-BF16, AMX): bfloat16 projections are "
        "packed and multiplied in float32 (exact products, float32 sums, bfloat16 outputs), "
        "their weights taking twice the memory; oneDNN's emulated bfloat16 is several times "
        "slower"
    )


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A oneDNN-blocked copy of ``weight`` [out, in] for ``mkldnn._linear_pointwise``, in
    ``packing_dtype`` (bfloat16 weights as float32 on a CPU without bfloat16 dot products),
    or None where oneDNN does not pack it (not the CPU, float16, no oneDNN)."""
    dtype = packing_dtype(weight.dtype)
    if weight.device.type != "cpu" or dtype is None:
        return None
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return None
    if dtype != weight.dtype:
        _say_bfloat16_in_float32()
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
        weight.detach().to(dtype).contiguous(), PACK_ROWS_HINT
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
        # The bias in the packed weight's dtype (bfloat16 multiplied in float32).
        self.packed_bias: torch.Tensor | None = None
        # Set by ``compiled_layers``: a compiled graph calls this projection as an opaque op.
        self.op_slot: torch.Tensor | None = None

    def prepack(self, *, release: bool = False) -> bool:
        """Keep a oneDNN-blocked copy of the weight for ``forward`` (CPU; float32, and
        bfloat16: as bfloat16 where the CPU multiplies it in hardware, else as float32).

        Call it once the weight is loaded (and again if it changes). Other devices and
        dtypes keep ``F.linear``; returns whether a packed copy is now in use. ``release``
        then frees the unpacked weight (leaving it empty), for a weight no other module
        shares; packing again after that keeps the packed copy. ``bench.decode_step``
        measures what packing gains.
        """
        weight = self.weight
        if weight.numel() == 0:
            # Packed already and the unpacked weight let go; or let go by its owner
            # (``MLP.fuse_activation``), with nothing to pack.
            return self.packed is not None
        self.packed = packed_weight(weight)
        if self.packed is None:
            return False
        bias = self.bias
        self.packed_bias = None if bias is None else bias.detach().to(self.packed.dtype)
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
        packed = self.packed
        if packed is not None:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x.to(packed.dtype), packed, self.packed_bias, "none", [], ""
            )
            return out.to(x.dtype)
        return F.linear(x, self.weight, self.bias)


def prepack_projections(model: nn.Module) -> int:
    """``Linear.prepack`` every projection of ``model``, freeing the unpacked weights no
    other module shares (a tied output projection keeps the embedding's); returns how
    many projections are packed."""
    owners = Counter(id(param) for _, param in model.named_parameters(remove_duplicate=False))
    modules = [m for m in model.modules() if isinstance(m, Linear)]
    return sum(m.prepack(release=owners[id(m.weight)] == 1) for m in modules)


def has_packed_projections(model: nn.Module) -> bool:
    """Whether any projection of ``model`` runs through a oneDNN-packed weight (an MLP's gate
    and up are packed apart only where its other projections are packed too)."""
    return any(isinstance(m, Linear) and m.packed is not None for m in model.modules())
