"""Accelerator presets: memory, memory bandwidth and dense bf16 FLOP/s.

Figures are the vendors' data sheets; NVIDIA quotes tensor FLOP/s "with sparsity", so the
dense figure used here is half of it.

- H100 SXM 80 GB: NVIDIA H100 Tensor Core GPU data sheet (2023): 80 GB HBM3, 3.35 TB/s,
  BF16 1,979 TFLOPS with sparsity.
- H200 SXM 141 GB: NVIDIA H200 Tensor Core GPU data sheet (2024): 141 GB HBM3e, 4.8 TB/s,
  BF16 1,979 TFLOPS with sparsity.
- A100 80 GB SXM: NVIDIA A100 Tensor Core GPU data sheet (2021): 80 GB HBM2e, 2,039 GB/s,
  BF16 312 TFLOPS dense (624 with sparsity).
- L4: NVIDIA L4 Tensor Core GPU data sheet (2023): 24 GB GDDR6, 300 GB/s, BF16 242 TFLOPS
  with sparsity.
- cpu: no data sheet; a nominal server socket (64 GiB, ~50 GB/s, ~1 TFLOP/s). Plan a CPU
  deployment with ``--calibrate`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
TB = 10**12
TFLOPS = 10**12


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator's peak figures."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("h100", 80 * GB, 3.35 * TB, 1979 / 2 * TFLOPS),
    "h200": GpuSpec("h200", 141 * GB, 4.8 * TB, 1979 / 2 * TFLOPS),
    "a100-80g": GpuSpec("a100-80g", 80 * GB, 2.039 * TB, 312 * TFLOPS),
    "l4": GpuSpec("l4", 24 * GB, 0.3 * TB, 242 / 2 * TFLOPS),
    "cpu": GpuSpec("cpu", 64 * 2**30, 50 * GB, 1 * TFLOPS),
}


def gpu_spec(name: str) -> GpuSpec:
    """The preset called ``name``; ValueError listing the known ones otherwise."""
    spec = GPUS.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown --gpu {name!r}; known: {', '.join(GPUS)}")
    return spec
