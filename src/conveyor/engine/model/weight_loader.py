"""Copying a checkpoint's safetensors (or GGUF) weights into the decoder, by Hugging Face name.

q/k/v and gate/up are packed into one matrix each in the decoder, so their checkpoint
tensors fill row ranges ("shards") of one parameter. Every parameter (and every shard)
must be filled exactly by name and shape, or loading fails with the names missing.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from conveyor.engine.model.gguf_format import find_gguf_file, read_gguf
from conveyor.engine.model.gguf_loader import gguf_tensors
from conveyor.engine.model.hf_config import DecoderConfig

__all__ = ["PACKED_SHARDS", "count_checkpoint_params", "load_weights"]

# HF projections we pack into one matrix: name -> (packed module name, shard index).
PACKED_SHARDS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def load_weights(model: nn.Module, config: DecoderConfig, checkpoint_dir: str | Path) -> None:
    """Copy every parameter from the checkpoint's safetensors files (sharded or not).

    A GGUF checkpoint (see ``gguf_format.find_gguf_file``) is read with ``gguf_loader``.
    """
    gguf_file = find_gguf_file(checkpoint_dir)
    if gguf_file is not None:
        loaded = _copy_tensors(model, config, gguf_tensors(gguf_file, config), gguf_file.name)
    else:
        loaded = set()
        for file in _safetensors_files(Path(checkpoint_dir)):
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                tensors = _safetensors_tensors(handle)
                loaded |= _copy_tensors(model, config, tensors, file.name)
    params = dict(model.named_parameters())
    missing = [target for target in _expected_targets(params) if target not in loaded]
    if missing:
        names = [name for name, _ in missing]
        raise ValueError(f"checkpoint {checkpoint_dir} lacks weights for: {names[:8]}")


def _copy_tensors(
    model: nn.Module,
    config: DecoderConfig,
    tensors: Iterable[tuple[str, Callable[[], torch.Tensor]]],
    source: str,
) -> set[tuple[str, int | None]]:
    """Copy ``(hf_name, read)`` tensors into the decoder by name; return what they filled."""
    params = dict(model.named_parameters())
    loaded: set[tuple[str, int | None]] = set()
    for hf_name, read in tensors:
        target = _map_name(hf_name, config)
        if target is None:
            continue  # skipped before reading: a tied copy is never dequantised
        name, shard = target
        if name not in params:
            raise ValueError(f"unexpected weight {hf_name!r} in {source}")
        _copy_weight(_destination(params[name], name, shard, config), read(), hf_name)
        loaded.add(target)
    return loaded


def _safetensors_tensors(handle: Any) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """``(name, read)`` for each tensor of an open safetensors file."""
    for hf_name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
        yield hf_name, functools.partial(handle.get_tensor, hf_name)


def _expected_targets(params: Mapping[str, nn.Parameter]) -> Iterator[tuple[str, int | None]]:
    """Every (parameter, shard) the checkpoint must fill; shard None for unpacked ones."""
    for name in params:
        count = _shard_count(name)
        for shard in range(count) if count else [None]:
            yield name, shard


def count_checkpoint_params(checkpoint_dir: Path) -> int:
    """Count the checkpoint's parameters from safetensors headers, without loading them."""
    gguf_file = find_gguf_file(checkpoint_dir)
    if gguf_file is not None:
        return read_gguf(gguf_file).num_params
    total = 0
    for file in sorted(checkpoint_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                total += math.prod(handle.get_slice(name).get_shape())
    return total


def _map_name(hf_name: str, config: DecoderConfig) -> tuple[str, int | None] | None:
    """Our parameter name (and packed shard) for a checkpoint tensor; None to skip it."""
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None  # old checkpoints saved this buffer; we compute it
    if hf_name == "lm_head.weight" and config.tie_word_embeddings:
        return None  # some tied checkpoints still carry a copy
    parts = hf_name.split(".")
    for index, part in enumerate(parts):
        if part in PACKED_SHARDS:
            packed, shard = PACKED_SHARDS[part]
            return ".".join([*parts[:index], packed, *parts[index + 1 :]]), shard
    return hf_name, None


def _shard_count(name: str) -> int:
    """How many checkpoint tensors fill this parameter (0 means one, unpacked)."""
    if ".qkv_proj." in name:
        return 3
    if ".gate_up_proj." in name:
        return 2
    return 0


def _shard_sizes(name: str, config: DecoderConfig) -> tuple[int, ...]:
    """Row counts of each packed shard of a parameter."""
    if ".qkv_proj." in name:
        return (config.q_size, config.kv_size, config.kv_size)
    return (config.intermediate_size, config.intermediate_size)


def _destination(
    param: nn.Parameter, name: str, shard: int | None, config: DecoderConfig
) -> torch.Tensor:
    """The whole parameter, or the rows of its packed ``shard``."""
    dest = param.data
    if shard is not None:
        sizes = _shard_sizes(name, config)
        dest = dest.narrow(0, sum(sizes[:shard]), sizes[shard])
    return dest


def _copy_weight(dest: torch.Tensor, tensor: torch.Tensor, hf_name: str) -> None:
    """Copy a checkpoint tensor into its destination, converting dtype; shapes must match."""
    if tuple(dest.shape) != tuple(tensor.shape):
        raise ValueError(
            f"weight {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
        )
    dest.copy_(tensor)


def _safetensors_files(checkpoint_dir: Path) -> Iterator[Path]:
    """The checkpoint's safetensors files, from the shard index when there is one."""
    index = checkpoint_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = sorted({checkpoint_dir / shard for shard in weight_map.values()})
    else:
        files = sorted(checkpoint_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {checkpoint_dir}")
    yield from files
