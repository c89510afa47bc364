"""Reading a PEFT LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``).

The decoder packs q/k/v into one ``qkv_proj`` and gate/up into one ``gate_up_proj``, so an
adapter's per-projection matrices are packed the same way: the ``A`` matrices of the
parts are stacked (``[sum of ranks, in]``) and their ``B`` matrices fill a block-diagonal
``[out, sum of ranks]`` whose row ranges are the parts' output rows. The scaling
(``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA) is folded into ``B``, so
the delta of a packed projection is ``(x A^T) B^T``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from conveyor.config.model_config import DEFAULT_MAX_ADAPTER_BYTES
from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.lora.files import (
    CONFIG_FILE,
    CONFIG_MAX_BYTES,
    WEIGHTS_FILE,
    AdapterError,
    read_adapter_file,
)
from conveyor.engine.model.weight_loader import PACKED_SHARDS

__all__ = ["AdapterError", "LoraWeights", "ModuleKey", "load_peft_adapter", "read_rank"]

# (decoder layer index, packed projection name)
ModuleKey = tuple[int, str]

# PEFT projection -> (our packed projection, part index): the checkpoint's packing, plus
# the projections kept whole.
_PARTS: dict[str, tuple[str, int]] = {
    **PACKED_SHARDS,
    "o_proj": ("o_proj", 0),
    "down_proj": ("down_proj", 0),
}
_KEY = re.compile(r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True, slots=True)
class LoraWeights:
    """One adapter's packed low-rank matrices: ``(layer, projection) -> (A, B)``."""

    rank: int
    modules: dict[ModuleKey, tuple[torch.Tensor, torch.Tensor]]

    def to(self, device: torch.device, dtype: torch.dtype) -> LoraWeights:
        """A copy on ``device`` in ``dtype`` (the same tensors when nothing changes)."""
        moved = {
            key: (a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype))
            for key, (a, b) in self.modules.items()
        }
        return LoraWeights(self.rank, moved)

    @property
    def nbytes(self) -> int:
        """Bytes the matrices take."""
        return sum(a.nbytes + b.nbytes for a, b in self.modules.values())


def read_rank(directory: Path, *, max_rank: int) -> tuple[int, float]:
    """The adapter's rank and scaling from its config; AdapterError if it cannot be served."""
    config = _read_config(directory)
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"adapter {directory}: 'r' must be a positive int, got {rank!r}")
    if rank > max_rank:
        raise AdapterError(
            f"adapter {directory} has rank {rank}, above this model's max_rank {max_rank}",
            param="lora_path",
        )
    for key, allowed in (("use_dora", (False, None)), ("bias", ("none", None))):
        if config.get(key) not in allowed:
            raise AdapterError(f"adapter {directory}: {key}={config.get(key)!r} is not supported")
    for key in ("modules_to_save", "rank_pattern", "alpha_pattern", "fan_in_fan_out"):
        if config.get(key):
            raise AdapterError(f"adapter {directory}: {key} is not supported")
    alpha = config.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise AdapterError(f"adapter {directory}: 'lora_alpha' must be a number")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def load_peft_adapter(
    directory: Path,
    config: DecoderConfig,
    *,
    max_rank: int,
    max_bytes: int = DEFAULT_MAX_ADAPTER_BYTES,
) -> LoraWeights:
    """Read and pack an adapter for a decoder of ``config``; AdapterError when it does not fit.

    The weights file is read whole through one descriptor (see `files`), at most
    ``max_bytes``, and parsed from memory.
    """
    rank, scaling = read_rank(directory, max_rank=max_rank)
    data = read_adapter_file(directory, WEIGHTS_FILE, max_bytes)
    try:
        tensors = load_safetensors(data)
    except (SafetensorError, ValueError) as exc:
        raise AdapterError(f"adapter {directory}: cannot read {WEIGHTS_FILE}: {exc}") from None
    del data  # the tensors hold their own copy
    parts = _collect_parts(directory, tensors, config, rank)
    if not parts:
        raise AdapterError(f"adapter {directory}: {WEIGHTS_FILE} holds no LoRA weights")
    modules = {key: _pack(key[1], found, config, scaling) for key, found in sorted(parts.items())}
    return LoraWeights(rank, modules)


def _read_config(directory: Path) -> dict[str, Any]:
    """The parsed ``adapter_config.json`` of a LoRA adapter."""
    data = read_adapter_file(directory, CONFIG_FILE, CONFIG_MAX_BYTES)
    try:
        config = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise AdapterError(f"adapter {directory}: cannot read {CONFIG_FILE}: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"adapter {directory}: {CONFIG_FILE} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(
            f"adapter {directory}: peft_type {config.get('peft_type')!r} is not LORA"
        )
    return config


def _collect_parts(
    directory: Path, tensors: dict[str, torch.Tensor], config: DecoderConfig, rank: int
) -> dict[ModuleKey, dict[int, list[torch.Tensor | None]]]:
    """Group the file's tensors by packed projection and part; check names and shapes."""
    parts: dict[ModuleKey, dict[int, list[torch.Tensor | None]]] = {}
    for name, tensor in tensors.items():
        match = _KEY.search(name)
        if match is None or match.group(2) not in _PARTS:
            raise AdapterError(f"adapter {directory}: weight {name!r} is not supported")
        layer = int(match.group(1))
        if layer >= config.num_layers:
            raise AdapterError(
                f"adapter {directory}: {name!r} names layer {layer}, beyond the model"
            )
        packed, part = _PARTS[match.group(2)]
        in_size, out_sizes = _shape(packed, config)
        is_a = match.group(3) == "A"
        expected = (rank, in_size) if is_a else (out_sizes[part], rank)
        if tuple(tensor.shape) != expected:
            raise AdapterError(
                f"adapter {directory}: {name!r} has shape {tuple(tensor.shape)}, "
                f"expected {expected} (is it for another base model?)"
            )
        pair = parts.setdefault((layer, packed), {}).setdefault(part, [None, None])
        pair[0 if is_a else 1] = tensor.to(torch.float32)
    for (layer, packed), found in parts.items():
        if any(a is None or b is None for a, b in found.values()):
            raise AdapterError(
                f"adapter {directory}: layer {layer} {packed} lacks lora_A or lora_B"
            )
    return parts


def _shape(packed: str, config: DecoderConfig) -> tuple[int, tuple[int, ...]]:
    """Input width and the parts' output widths of a packed projection."""
    hidden, inter = config.hidden_size, config.intermediate_size
    if packed == "qkv_proj":
        return hidden, (config.q_size, config.kv_size, config.kv_size)
    if packed == "o_proj":
        return config.q_size, (hidden,)
    if packed == "gate_up_proj":
        return hidden, (inter, inter)
    return inter, (hidden,)


def _pack(
    packed: str,
    found: dict[int, list[torch.Tensor | None]],
    config: DecoderConfig,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the parts' A matrices; lay their scaled B matrices out block-diagonally."""
    _, out_sizes = _shape(packed, config)
    pairs = [(part, found[part][0], found[part][1]) for part in sorted(found)]
    a_rows = [a for _, a, _ in pairs if a is not None]  # both set: see _collect_parts
    b_full = torch.zeros(sum(out_sizes), sum(a.shape[0] for a in a_rows))
    column = 0
    for part, _, b in pairs:
        assert b is not None
        row = sum(out_sizes[:part])
        b_full[row : row + b.shape[0], column : column + b.shape[1]] = b * scaling
        column += b.shape[1]
    return torch.cat(a_rows).contiguous(), b_full
