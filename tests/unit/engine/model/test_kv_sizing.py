"""Device and dtype names, bytes per cached token, and KV blocks for a budget."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.kv_sizing import (
    kv_cache_bytes_per_token,
    num_kv_blocks_for_memory_fraction,
    num_kv_blocks_for_tokens,
    resolve_dtype,
)

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


def test_cache_sizing_helpers(llama_path: Path) -> None:
    config = DecoderConfig.from_hf(load_hf_config(llama_path))
    assert num_kv_blocks_for_tokens(1, 16) == 1
    assert num_kv_blocks_for_tokens(16, 16) == 1
    assert num_kv_blocks_for_tokens(17, 16) == 2
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        num_kv_blocks_for_tokens(0, 16)
    # K and V x 2 layers x 2 KV heads x head_dim 16 x 2 bytes.
    assert kv_cache_bytes_per_token(config, torch.bfloat16) == 2 * 2 * 2 * 16 * 2


def test_memory_fraction_sizing_needs_cuda(llama_path: Path) -> None:
    with pytest.raises(ValueError, match="CUDA"):
        num_kv_blocks_for_memory_fraction(
            llama_path, block_size=16, memory_fraction=0.9, device="cpu"
        )
    with pytest.raises(ValueError, match="memory_fraction"):
        num_kv_blocks_for_memory_fraction(llama_path, block_size=16, memory_fraction=1.5)


def test_dtype_resolution() -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", torch.device("cpu"))
