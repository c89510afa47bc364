"""Where a model runs and how big its KV cache may be: device and dtype names, bytes per
cached token, and the number of blocks for a token budget or a share of a GPU's memory.
Call these before loading a model (the memory-fraction sizing subtracts its weights)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.weight_loader import count_checkpoint_params
from conveyor.errors import ModelOutOfMemory

__all__ = [
    "DEFAULT_ACTIVATION_RESERVE_BYTES",
    "KVOutOfMemory",
    "kv_cache_bytes_per_token",
    "num_kv_blocks_for_memory_fraction",
    "num_kv_blocks_for_tokens",
    "resolve_device",
    "resolve_dtype",
]

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

# Headroom kept free for a step's activations when sizing the cache from a memory fraction.
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * 1024**3


class KVOutOfMemory(ModelOutOfMemory):
    """The KV cache (or the weights) did not fit on the device; ask for fewer blocks."""


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` means CUDA when available, else CPU; anything else is passed to torch."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"`` means bfloat16 on CUDA and float32 elsewhere; names map to torch dtypes."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def kv_cache_bytes_per_token(config: DecoderConfig, dtype: torch.dtype) -> int:
    """Bytes of K and V, across all layers, that one cached token takes."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element_size


def num_kv_blocks_for_tokens(kv_cache_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``kv_cache_tokens`` tokens (rounded up)."""
    if kv_cache_tokens < 1:
        raise ValueError(f"kv_cache_tokens must be >= 1, got {kv_cache_tokens}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return math.ceil(kv_cache_tokens / block_size)


def num_kv_blocks_for_memory_fraction(
    checkpoint_dir: str | Path,
    *,
    block_size: int,
    memory_fraction: float,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
) -> int:
    """Blocks that fit when this process may use ``memory_fraction`` of the CUDA device.

    Call it before loading the model: it subtracts what is already in use on the device,
    the checkpoint's weights (at the target dtype) and ``activation_reserve_bytes``.
    """
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    resolved = resolve_device(device)
    if resolved.type != "cuda":
        raise ValueError("sizing the KV cache by memory fraction needs a CUDA device")
    target_dtype = resolve_dtype(dtype, resolved)
    config = DecoderConfig.from_hf(load_hf_config(checkpoint_dir))
    free_bytes, total_bytes = torch.cuda.mem_get_info(resolved)
    in_use_bytes = total_bytes - free_bytes
    weight_bytes = count_checkpoint_params(Path(checkpoint_dir)) * _element_size(target_dtype)
    budget = total_bytes * memory_fraction - in_use_bytes - weight_bytes - activation_reserve_bytes
    block_bytes = kv_cache_bytes_per_token(config, target_dtype) * block_size
    num_blocks = int(budget // block_bytes)
    if num_blocks < 1:
        raise KVOutOfMemory(
            f"no room for a KV cache: {budget / 1024**3:.2f} GiB left after weights and reserve"
        )
    return num_blocks


def _element_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()
