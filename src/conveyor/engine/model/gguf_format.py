"""A GGUF file read into what the decoder needs: its config, its tensors' names and types.

Torch-free, like ``hf_config``: the service sizes the KV cache and checks its limits from
these facts before any model is built. The metadata maps onto the dict a Hugging Face
``config.json`` would hold, so ``DecoderConfig.from_hf`` checks a GGUF exactly as it checks
a checkpoint directory, and the tensor names map onto Hugging Face names, so the weight
loader packs them as it packs safetensors. What the decoder cannot run (another
architecture, a tensor type ``gguf`` cannot dequantise, rope scaling we do not implement)
is a ValueError naming it, raised before any weight is read.

Supported architectures (``general.architecture``): ``llama`` (Llama 1-3, Mistral and
SmolLM2 GGUFs use it), ``qwen2`` and ``qwen3``.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GGUF_ARCHITECTURES",
    "GGUF_SUFFIX",
    "GgufModel",
    "GgufTensor",
    "find_gguf_file",
    "hf_config_of",
    "hf_tensor_name",
    "read_gguf",
]

GGUF_SUFFIX = ".gguf"

# general.architecture -> (config.json model_type, its architectures entry).
GGUF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}

# Metadata keys (after the "<architecture>." prefix) -> config.json keys.
_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "context_length": "max_position_embeddings",
    "rope.freq_base": "rope_theta",
}
_REQUIRED_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")

# Tensors outside the blocks, and the per-block ones ("blk.N.<piece>"), by Hugging Face name.
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL_NAME = re.compile(r"^(\w+)\.(weight|bias)$")
# Llama 3.1-style scaling: llama.cpp stores it as per-dimension frequency factors.
_ROPE_FREQS = "rope_freqs.weight"
# End-of-generation ids llama.cpp reads (a chat model's end of turn is often eot, not eos).
_STOP_TOKEN_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor of the file: its GGUF and Hugging Face names, type and torch shape."""

    name: str
    hf_name: str
    type_name: str
    shape: tuple[int, ...]  # torch order: GGUF lists dimensions the other way round
    # Where ``gguf`` found the data, and the array it read there (numpy dtype and shape: a
    # quantised tensor is rows of bytes), so the loader maps it again without re-parsing.
    data_offset: int
    stored_dtype: str
    stored_shape: tuple[int, ...]

    @property
    def num_elements(self) -> int:
        """Values the tensor holds."""
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True, slots=True)
class GgufModel:
    """What a GGUF file says about its model, checked; no tensor data is read."""

    file: Path
    architecture: str
    tensors: tuple[GgufTensor, ...]
    _config: Mapping[str, Any]

    def config_dict(self) -> dict[str, Any]:
        """The dict a ``config.json`` of this model would hold (a fresh copy)."""
        return copy.deepcopy(dict(self._config))

    @property
    def num_params(self) -> int:
        """Parameters of the model (a tied embedding counted once)."""
        return sum(tensor.num_elements for tensor in self.tensors)


def find_gguf_file(path: str | Path) -> Path | None:
    """The GGUF file a model path names; None for a Hugging Face checkpoint directory.

    A ``.gguf`` file names itself. A directory with a ``config.json``, or without any
    ``.gguf`` file, is read as a Hugging Face checkpoint; one holding a ``.gguf`` file and
    no config.json must hold exactly one (ValueError otherwise).
    """
    path = Path(path)
    if path.is_file():
        if path.suffix != GGUF_SUFFIX:
            raise ValueError(f"model file {path} is not a {GGUF_SUFFIX} file")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(child.name for child in path.glob(f"*{GGUF_SUFFIX}") if child.is_file())
    if len(found) <= 1:
        return path / found[0] if found else None
    raise ValueError(
        f"model directory {path} holds {len(found)} .gguf files ({', '.join(found)}); "
        "name one of them as the path"
    )


def read_gguf(file: str | Path) -> GgufModel:
    """Read and check a GGUF file's metadata and tensor list (memoised per file version)."""
    path = Path(file).resolve()
    stat = path.stat()
    return _read_gguf(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_gguf(path: Path, _mtime_ns: int, _size: int) -> GgufModel:
    """The uncached read: ``gguf`` parses the whole header (seconds for a big vocabulary)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path.name} is not a readable GGUF file: {exc}") from None
    if reader.byte_order != "I":
        raise ValueError(f"{path.name}: GGUF files of the other byte order are not supported")
    metadata = {name: _field_value(field) for name, field in _small_fields(reader)}
    architecture = str(metadata.get("general.architecture", ""))
    if architecture not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{path.name}: unsupported GGUF architecture {architecture!r}; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    tensors = tuple(_checked_tensor(path.name, tensor) for tensor in reader.tensors)
    config = hf_config_of(architecture, metadata, tensors)
    return GgufModel(path, architecture, tensors, config)


def _small_fields(reader: Any) -> list[tuple[str, Any]]:
    """The metadata fields worth decoding: not the vocabulary's long arrays."""
    return [(name, field) for name, field in reader.fields.items() if len(field.data) <= 16]


def _field_value(field: Any) -> Any:
    """A metadata value as plain Python (one-element arrays as their element)."""
    value = field.contents()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _checked_tensor(file_name: str, tensor: Any) -> GgufTensor:
    """A tensor entry, once its name maps and its type can be dequantised."""
    type_name = tensor.tensor_type.name
    if tensor.name == _ROPE_FREQS:
        raise ValueError(
            f"{file_name}: per-dimension rope frequencies ({_ROPE_FREQS}, Llama 3.1-style "
            "rope scaling) are not supported"
        )
    if not _can_dequantise(tensor.tensor_type):
        raise ValueError(
            f"{file_name}: tensor {tensor.name!r} has type {type_name}, which gguf cannot "
            "dequantise"
        )
    hf_name = hf_tensor_name(tensor.name)
    if hf_name is None:
        raise ValueError(f"{file_name}: unexpected tensor {tensor.name!r}")
    shape = tuple(int(size) for size in reversed(tensor.shape.tolist()))
    stored = tensor.data
    return GgufTensor(
        tensor.name, hf_name, type_name, shape, int(tensor.data_offset), stored.dtype.str,
        tuple(int(size) for size in stored.shape),
    )  # fmt: skip


@functools.cache
def _can_dequantise(tensor_type: Any) -> bool:
    """Whether ``gguf.dequantize`` handles the type (asked of one zeroed block)."""
    from gguf import GGML_QUANT_SIZES, dequantize

    _, type_size = GGML_QUANT_SIZES[tensor_type]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), tensor_type)
    except NotImplementedError:
        return False
    return True


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); None for a name we do not know."""
    block = _BLOCK_NAME.match(gguf_name)
    if block is not None:
        index, piece, kind = block.groups()
        module = _BLOCK_TENSORS.get(piece)
        return None if module is None else f"model.layers.{int(index)}.{module}.{kind}"
    top = _GLOBAL_NAME.match(gguf_name)
    if top is not None and top.group(1) in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[top.group(1)]}.{top.group(2)}"
    return None


def hf_config_of(
    architecture: str, metadata: Mapping[str, Any], tensors: tuple[GgufTensor, ...]
) -> dict[str, Any]:
    """The ``config.json`` dict of a model from its GGUF metadata and tensor list."""
    model_type, hf_architecture = GGUF_ARCHITECTURES[architecture]
    prefix = f"{architecture}."
    for key in _REQUIRED_KEYS:
        if prefix + key not in metadata:
            raise ValueError(f"GGUF metadata lacks {prefix + key}")
    config: dict[str, Any] = {
        "architectures": [hf_architecture],
        "model_type": model_type,
        "hidden_act": "silu",
        "vocab_size": _vocab_size(tensors),
        "tie_word_embeddings": not any(t.hf_name == "lm_head.weight" for t in tensors),
        "attention_bias": any(t.hf_name.endswith("q_proj.bias") for t in tensors),
        **_token_ids(metadata),
    }
    for key, hf_key in _CONFIG_KEYS.items():
        if prefix + key in metadata:
            config[hf_key] = _scalar(prefix + key, metadata[prefix + key])
    _check_rope_dimensions(config, metadata.get(prefix + "rope.dimension_count"))
    scaling = _rope_scaling(prefix, metadata)
    if scaling is not None:
        config["rope_scaling"] = scaling
    return config


def _scalar(key: str, value: Any) -> int | float:
    """A numeric metadata value (per-layer arrays, used by a few models, are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"GGUF metadata {key} must be one number, got {value!r}")
    return value


def _vocab_size(tensors: tuple[GgufTensor, ...]) -> int:
    """Rows of the token embedding: the vocabulary the weights really have."""
    for tensor in tensors:
        if tensor.hf_name == "model.embed_tokens.weight":
            return tensor.shape[0]
    raise ValueError("GGUF file has no token_embd.weight tensor")


def _token_ids(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """BOS id, and every id that ends generation as ``eos_token_id`` (a list when several)."""
    ids: dict[str, Any] = {}
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if isinstance(bos, int):
        ids["bos_token_id"] = bos
    values = [metadata.get(f"tokenizer.ggml.{key}") for key in _STOP_TOKEN_KEYS]
    stops = sorted({int(value) for value in values if isinstance(value, int)})
    if stops:
        ids["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    return ids


def _check_rope_dimensions(config: Mapping[str, Any], dimensions: Any) -> None:
    """Rope must turn whole heads: partial rotary embeddings are not implemented."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if dimensions is not None and int(dimensions) != int(head_dim):
        raise ValueError(
            f"GGUF rope.dimension_count {dimensions} differs from the head size {head_dim}: "
            "partial rotary embeddings are not supported"
        )


def _rope_scaling(prefix: str, metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """``rope_scaling`` from ``rope.scaling.*`` (or the older ``rope.scale_linear``)."""
    kind = str(metadata.get(prefix + "rope.scaling.type", "none"))
    factor = metadata.get(prefix + "rope.scaling.factor")
    if kind == "none" and prefix + "rope.scale_linear" in metadata:
        kind, factor = "linear", metadata[prefix + "rope.scale_linear"]
    if kind == "none" or (kind == "linear" and float(factor or 1.0) == 1.0):
        return None
    if kind != "linear" or factor is None:
        raise ValueError(f"unsupported GGUF rope scaling {kind!r}; supported: none, linear")
    return {"rope_type": "linear", "factor": float(factor)}
