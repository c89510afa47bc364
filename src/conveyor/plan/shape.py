"""A decoder's size facts from its ``config.json`` (or GGUF metadata): parameters, weight and
KV bytes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.engine.model.hf_config import DecoderConfig

# Bytes per value. Weights may be int4 (AWQ, GPTQ); a KV cache is 16 or 8 bits a value.
DTYPE_BYTES: dict[str, float] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1, "int4": 0.5,
}  # fmt: skip
# Other spellings of those names (vLLM's and the short ones).
DTYPE_ALIASES = {
    "fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
    "fp8": "float8", "fp8_e4m3": "float8", "fp8_e5m2": "float8",
}  # fmt: skip
KV_DTYPES = ("float32", "float16", "bfloat16", "float8", "int8")
DEFAULT_KV_DTYPE = "bfloat16"


def dtype_bytes(name: str, *, for_kv: bool = False) -> float:
    """Bytes per value of dtype ``name`` (an alias allowed); ValueError for others."""
    canonical = DTYPE_ALIASES.get(name.lower(), name.lower())
    known = KV_DTYPES if for_kv else tuple(DTYPE_BYTES)
    if canonical not in known:
        what = "--kv-cache-dtype" if for_kv else "dtype"
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(known)}")
    return DTYPE_BYTES[canonical]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the arithmetic needs about a model."""

    name: str
    num_params: int
    dtype_bytes: float
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int = 0
    # The KV cache's own dtype (weights of int8 often keep a bf16 cache).
    kv_dtype_bytes: float = 2

    @property
    def weight_bytes(self) -> int:
        """Parameters times bytes per parameter."""
        return round(self.num_params * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values: 2 x layers x kv_heads x head_dim x bytes of the KV dtype."""
        return self.kv_bytes_per_token_per_gpu(1)

    def kv_bytes_per_token_per_gpu(self, tensor_parallel_size: int) -> int:
        """One GPU's share of a token's keys and values when the KV heads are split
        ``tensor_parallel_size`` ways (a GPU holds at least one head: fewer heads than GPUs
        are copied, as vLLM does)."""
        heads = math.ceil(self.num_kv_heads / tensor_parallel_size)
        return round(2 * self.num_layers * heads * self.head_dim * self.kv_dtype_bytes)


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


def shape_from_hf(
    raw: dict[str, Any], name: str, dtype: str | None = None, kv_dtype: str = DEFAULT_KV_DTYPE
) -> ModelShape:
    """The shape of the model a HF config describes, weights at ``dtype`` (default: its
    own) and its KV cache at ``kv_dtype`` (``auto``: the weights' dtype)."""
    # Here, not at the top: the CLI and the dashboard import this module, and the GGUF
    # reader beneath the config reader costs most of a second to import.
    from conveyor.engine.model.hf_config import DecoderConfig

    config = DecoderConfig.from_hf(raw)
    weights = dtype_bytes(dtype or str(raw.get("torch_dtype") or "float16"))
    kv = weights if kv_dtype == "auto" else dtype_bytes(kv_dtype, for_kv=True)
    return ModelShape(
        name=name,
        num_params=count_params(config),
        dtype_bytes=weights,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        hidden_size=config.hidden_size,
        kv_dtype_bytes=kv,
    )


def load_shape(
    path: Path, dtype: str | None = None, kv_dtype: str = DEFAULT_KV_DTYPE
) -> ModelShape:
    """Read ``path``: a ``config.json``, a checkpoint directory holding one, or a GGUF file."""
    from conveyor.engine.model.gguf_format import GGUF_SUFFIX
    from conveyor.engine.model.hf_config import load_hf_config

    if path.is_file() and path.suffix != GGUF_SUFFIX:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return shape_from_hf(raw, path.parent.name, dtype, kv_dtype)
    name = path.stem if path.is_file() else path.name
    return shape_from_hf(load_hf_config(path), name, dtype, kv_dtype)
