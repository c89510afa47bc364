"""Accelerator presets: memory, memory bandwidth, dense bf16 FLOP/s and the link between
the GPUs of one server (what tensor parallelism's all-reduces cross).

Figures are the vendors' data sheets; NVIDIA quotes tensor FLOP/s "with sparsity", so the
dense figure used here is half of it. Link bandwidth is per direction (a ring all-reduce
sends and receives at once); NVIDIA quotes NVLink both ways together, so half of it.

- H100 SXM 80 GB: NVIDIA H100 Tensor Core GPU data sheet (2023): 80 GB HBM3, 3.35 TB/s,
  BF16 1,979 TFLOPS with sparsity, NVLink 900 GB/s.
- H200 SXM 141 GB: NVIDIA H200 Tensor Core GPU data sheet (2024): 141 GB HBM3e, 4.8 TB/s,
  BF16 1,979 TFLOPS with sparsity, NVLink 900 GB/s.
- A100 80 GB SXM: NVIDIA A100 Tensor Core GPU data sheet (2021): 80 GB HBM2e, 2,039 GB/s,
  BF16 312 TFLOPS dense (624 with sparsity), NVLink 600 GB/s.
- L4: NVIDIA L4 Tensor Core GPU data sheet (2023): 24 GB GDDR6, 300 GB/s, BF16 242 TFLOPS
  with sparsity; no NVLink: PCIe Gen4 x16, 64 GB/s both ways.
- cpu: no data sheet; a nominal server socket (64 GiB, ~50 GB/s, ~1 TFLOP/s), one per
  replica (no tensor parallelism). Plan a CPU deployment with ``--calibrate`` instead.

An all-reduce also costs a fixed start-up time whatever its size: ``LINK_LATENCY_S`` is a
nominal figure (collective libraries report a few microseconds over NVLink, tens over PCIe).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
TB = 10**12
TFLOPS = 10**12


LINK_LATENCY_S = {"nvlink": 10e-6, "pcie": 25e-6}


@dataclass(frozen=True, slots=True)
class Link:
    """The link between a server's GPUs: its kind and bandwidth each way."""

    kind: str  # "nvlink" or "pcie"
    bytes_per_s: float

    @property
    def latency_s(self) -> float:
        """The fixed cost of one all-reduce over this link."""
        return LINK_LATENCY_S[self.kind]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator's peak figures, and its link to the others of a server (None: one
    device a replica)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float
    link: Link | None = None


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("h100", 80 * GB, 3.35 * TB, 1979 / 2 * TFLOPS, Link("nvlink", 450 * GB)),
    "h200": GpuSpec("h200", 141 * GB, 4.8 * TB, 1979 / 2 * TFLOPS, Link("nvlink", 450 * GB)),
    "a100-80g": GpuSpec("a100-80g", 80 * GB, 2.039 * TB, 312 * TFLOPS, Link("nvlink", 300 * GB)),
    "l4": GpuSpec("l4", 24 * GB, 0.3 * TB, 242 / 2 * TFLOPS, Link("pcie", 32 * GB)),
    "cpu": GpuSpec("cpu", 64 * 2**30, 50 * GB, 1 * TFLOPS),
}


def gpu_spec(name: str) -> GpuSpec:
    """The preset called ``name``; ValueError listing the known ones otherwise."""
    spec = GPUS.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown --gpu {name!r}; known: {', '.join(GPUS)}")
    return spec
