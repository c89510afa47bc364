"""``conveyor models import``: a GGUF file written as the equivalent checkpoint directory.

The directory holds the dequantised weights as safetensors (Hugging Face names and row
order, see ``gguf_loader``), ``config.json`` and ``generation_config.json`` (written by
transformers' own config classes) and the tokenizer transformers builds from the metadata.
It loads with Conveyor's safetensors path and with transformers, and can be pushed to the
fleet (``conveyor models push``). It is written beside its destination and renamed into
place, so a failed import leaves nothing behind.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from conveyor.engine.model.gguf_format import GgufModel, find_gguf_file, read_gguf
from conveyor.engine.model.gguf_loader import gguf_tensors
from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.tokenizer import Tokenizer

__all__ = ["DEFAULT_SHARD_BYTES", "IMPORT_DTYPES", "ImportedModel", "import_gguf", "plan_shards"]

DEFAULT_SHARD_BYTES = 2 * 1024**3
IMPORT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class ImportedModel:
    """What an import wrote."""

    directory: Path
    num_params: int
    weight_files: tuple[str, ...]
    weight_bytes: int


def import_gguf(
    source: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "float32",
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> ImportedModel:
    """Write the GGUF file ``source`` names as a checkpoint directory ``out_dir``.

    ``out_dir`` must not exist or be empty. float32 keeps the dequantised values exactly
    (what serving the GGUF uses on a CPU); float16 and bfloat16 round them.
    """
    if dtype not in IMPORT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(IMPORT_DTYPES)}, got {dtype!r}")
    file = find_gguf_file(source)
    if file is None:
        raise ValueError(f"{source} is not a .gguf file")
    model = read_gguf(file)
    config = DecoderConfig.from_hf(model.config_dict())  # what Conveyor cannot run fails here
    target = Path(out_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{target} already exists and is not an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp: the directory gets the usual permissions, not 0700.
    staging = target.parent / f".{target.name}.{secrets.token_hex(4)}.partial"
    staging.mkdir()
    try:
        Tokenizer(file).hf.save_pretrained(str(staging))
        _write_configs(model, dtype, staging)
        files, size = _write_weights(model, config, IMPORT_DTYPES[dtype], staging, max_shard_bytes)
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ImportedModel(target, model.num_params, files, size)


def plan_shards(sizes: Sequence[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Tensor names grouped, in order, into shards of at most ``max_bytes`` each (a bigger
    tensor gets a shard of its own)."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    shards: list[list[str]] = []
    used = 0
    for name, size in sizes:
        if not shards or used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _write_configs(model: GgufModel, dtype: str, directory: Path) -> None:
    """config.json and generation_config.json, as transformers writes them."""
    from transformers import AutoConfig, GenerationConfig

    raw = model.config_dict()
    model_type = raw.pop("model_type")
    hf_config: Any = AutoConfig.for_model(model_type, **raw)
    hf_config.dtype = dtype
    hf_config.save_pretrained(str(directory))
    generation: Any = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id")
    )
    generation.save_pretrained(str(directory))


def _write_weights(
    model: GgufModel, config: DecoderConfig, dtype: torch.dtype, directory: Path, max_bytes: int
) -> tuple[tuple[str, ...], int]:
    """The weights in shards (with an index when several); returns the files and bytes."""
    element = torch.empty((), dtype=dtype).element_size()
    sizes = [(tensor.hf_name, tensor.num_elements * element) for tensor in model.tensors]
    shards = plan_shards(sizes, max_bytes)
    names = _shard_names(len(shards))
    file_of = {name: names[index] for index, shard in enumerate(shards) for name in shard}
    shard_ends = {shard[-1] for shard in shards}
    pending: dict[str, torch.Tensor] = {}
    for hf_name, read in gguf_tensors(model.file, config):
        pending[hf_name] = read().to(dtype).contiguous()
        if hf_name in shard_ends:  # the shard is complete: write it and let it go
            save_file(pending, str(directory / file_of[hf_name]), metadata={"format": "pt"})
            pending = {}
    total = sum(size for _, size in sizes)
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": file_of}
        (directory / _INDEX_FILE).write_text(json.dumps(index, indent=2), encoding="utf-8")
    return tuple(names), total


def _shard_names(count: int) -> list[str]:
    """Hugging Face's file names for ``count`` weight shards."""
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{index:05d}-of-{count:05d}.safetensors" for index in range(1, count + 1)]
