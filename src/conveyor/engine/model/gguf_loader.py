"""A GGUF file's tensors, dequantised and named as the Hugging Face checkpoint names them.

``gguf`` reads and dequantises (to float32); this module gives each tensor its Hugging
Face name (``gguf_format.hf_tensor_name``) and undoes what llama.cpp's converter changed:

- For the ``llama`` architecture the converter reorders each head's rows of the query and
  key projections, because llama.cpp rotates adjacent pairs of a head's dimensions where
  Hugging Face rotates its first half against its second. Row ``2i`` of a converted head
  is Hugging Face row ``i`` and row ``2i + 1`` is row ``i + head_dim / 2``, so taking the
  even rows, then the odd ones, restores the original order. ``qwen2`` and ``qwen3`` use
  Hugging Face's layout in llama.cpp too, so their rows are left alone.

The weight loader copies the tensors into the decoder (converting to its dtype), and
``gguf_import`` writes them as safetensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from conveyor.engine.model.gguf_format import GgufTensor, read_gguf
from conveyor.engine.model.hf_config import DecoderConfig

__all__ = ["gguf_tensors", "unpermute_rows"]

# Architectures whose q/k rows llama.cpp's converter reorders for its rope layout.
_PERMUTED_ARCHITECTURES = frozenset({"llama"})


def gguf_tensors(
    file: str | Path, config: DecoderConfig
) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """``(hf_name, read)`` for every tensor; ``read()`` dequantises it to float32.

    The tensors are where ``read_gguf`` found them (its parse of the header is memoised, so
    the file's metadata is not read twice); reading is deferred so that a skipped tensor is
    never dequantised.
    """
    model = read_gguf(file)  # checked: every name maps, every type dequantises
    mapped = np.memmap(model.file, dtype=np.uint8, mode="r")
    permuted = model.architecture in _PERMUTED_ARCHITECTURES
    for tensor in model.tensors:
        heads = _permuted_heads(tensor, config) if permuted else None
        yield tensor.hf_name, functools.partial(_dequantised, mapped, tensor, heads)


def _permuted_heads(tensor: GgufTensor, config: DecoderConfig) -> int | None:
    """Heads whose rows llama.cpp reordered in this tensor (None when it left them)."""
    if ".self_attn.q_proj." in tensor.hf_name:
        return config.num_heads
    if ".self_attn.k_proj." in tensor.hf_name:
        return config.num_kv_heads
    return None


def _dequantised(mapped: np.ndarray, tensor: GgufTensor, heads: int | None) -> torch.Tensor:
    """One tensor as float32 in torch's shape, its rows restored to Hugging Face order."""
    from gguf import GGMLQuantizationType, dequantize

    dtype = np.dtype(tensor.stored_dtype)
    size = int(np.prod(tensor.stored_shape, dtype=np.int64)) * dtype.itemsize
    stored = mapped[tensor.data_offset : tensor.data_offset + size]
    raw = stored.view(dtype).reshape(tensor.stored_shape)
    values = np.asarray(dequantize(raw, GGMLQuantizationType[tensor.type_name]), np.float32)
    if not values.flags.writeable:  # an F32 tensor comes back as a view of the mapped file
        values = values.copy()
    weights = torch.from_numpy(values).reshape(tensor.shape)
    return weights if heads is None else unpermute_rows(weights, heads)


def unpermute_rows(weights: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head reordering of q/k rows (weights or biases)."""
    rows = weights.shape[0]
    if rows % (2 * num_heads) != 0:
        raise ValueError(f"{rows} rows do not split into {num_heads} heads of even size")
    heads = weights.reshape(num_heads, rows // num_heads, *weights.shape[1:])
    return torch.cat([heads[:, 0::2], heads[:, 1::2]], dim=1).reshape(weights.shape)
