"""A decoder's size facts from its ``config.json`` (or GGUF metadata): parameters, weight and
KV bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.engine.model.gguf_format import GGUF_SUFFIX
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the arithmetic needs about a model."""

    name: str
    num_params: int
    dtype_bytes: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def weight_bytes(self) -> int:
        """Parameters times bytes per parameter."""
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


def count_params(config: DecoderConfig) -> int:
    """Parameters of a Llama-family decoder (SwiGLU MLP, RMS norms, optional biases)."""
    hidden, q_size, kv_size = config.hidden_size, config.q_size, config.kv_size
    attention = hidden * q_size + 2 * hidden * kv_size + q_size * hidden
    if config.has_qkv_bias:
        attention += q_size + 2 * kv_size
    if config.has_o_bias:
        attention += hidden
    mlp = 3 * hidden * config.intermediate_size
    if config.has_mlp_bias:
        mlp += 2 * config.intermediate_size + hidden
    norms = 2 * hidden + (2 * config.head_dim if config.has_qk_norm else 0)
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return config.num_layers * (attention + mlp + norms) + embeddings + hidden


def shape_from_hf(raw: dict[str, Any], name: str, dtype: str | None = None) -> ModelShape:
    """The shape of the model a HF config describes, at ``dtype`` (default: its own)."""
    config = DecoderConfig.from_hf(raw)
    dtype_name = dtype or str(raw.get("torch_dtype") or "float16")
    if dtype_name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype_name!r}; known: {', '.join(DTYPE_BYTES)}")
    return ModelShape(
        name=name,
        num_params=count_params(config),
        dtype_bytes=DTYPE_BYTES[dtype_name],
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
    )


def load_shape(path: Path, dtype: str | None = None) -> ModelShape:
    """Read ``path``: a ``config.json``, a checkpoint directory holding one, or a GGUF file."""
    if path.is_file() and path.suffix != GGUF_SUFFIX:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return shape_from_hf(raw, path.parent.name, dtype)
    name = path.stem if path.is_file() else path.name
    return shape_from_hf(load_hf_config(path), name, dtype)
