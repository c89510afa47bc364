"""A checkpoint's Hugging Face ``config.json`` read into the facts the decoder needs.

A GGUF file stands in for the directory: its metadata maps onto the same dict.

Torch-free: the service sizes the KV cache from these facts before any model is built.
Anything the decoder cannot run (another architecture, another activation, a rope type
we do not implement) is a ValueError here, at load time, not a wrong answer later.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.engine.model.gguf_format import find_gguf_file, read_gguf

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "DecoderConfig",
    "RopeSpec",
    "load_hf_config",
    "read_eos_token_ids",
]

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3"})


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary embedding settings read from ``rope_parameters`` / ``rope_scaling``.

    ``layers.rotary.inverse_frequencies`` turns them into the rotation frequencies.
    """

    rope_type: str
    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    """The architecture facts the decoder needs, parsed from a Hugging Face ``config.json``."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeSpec
    tie_word_embeddings: bool
    has_qkv_bias: bool
    has_o_bias: bool
    has_mlp_bias: bool
    has_qk_norm: bool
    sliding_windows: tuple[int | None, ...]

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if len(self.sliding_windows) != self.num_layers:
            raise ValueError("sliding_windows needs one entry per layer")

    @property
    def q_size(self) -> int:
        """Width of the query projection output."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection output."""
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> DecoderConfig:
        """Parse a Hugging Face config dict; raise ValueError for what we cannot run."""
        model_type = str(raw.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {sorted(SUPPORTED_MODEL_TYPES)}"
            )
        activation = raw.get("hidden_act", "silu")
        if activation != "silu":
            raise ValueError(f"unsupported hidden_act {activation!r}; only 'silu' is supported")
        num_heads = int(raw["num_attention_heads"])
        hidden_size = int(raw["hidden_size"])
        num_layers = int(raw["num_hidden_layers"])
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden_size // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rope=_parse_rope(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always biases q/k/v (and never o); the others follow attention_bias.
            has_qkv_bias=model_type == "qwen2" or attention_bias,
            has_o_bias=model_type != "qwen2" and attention_bias,
            has_mlp_bias=bool(raw.get("mlp_bias", False)),
            has_qk_norm=model_type == "qwen3",
            sliding_windows=_parse_sliding_windows(raw, model_type, num_layers),
        )


def load_hf_config(checkpoint_dir: str | Path) -> dict[str, Any]:
    """Read ``config.json`` from a checkpoint directory.

    A GGUF checkpoint (a ``.gguf`` file, or a directory holding one and no config.json)
    gives the dict its metadata maps onto (see ``gguf_format``).
    """
    gguf_file = find_gguf_file(checkpoint_dir)
    if gguf_file is not None:
        return read_gguf(gguf_file).config_dict()
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json (nor a .gguf file) in {checkpoint_dir}")
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def _parse_rope(raw: Mapping[str, Any]) -> RopeSpec:
    """Read RoPE settings from transformers 5 ``rope_parameters`` or 4.x ``rope_scaling``."""
    # transformers 4.x keeps rope_theta at the top level and scaling in rope_scaling;
    # transformers 5 folds both into rope_parameters. Merge so either layout works.
    params: dict[str, Any] = {
        **(raw.get("rope_scaling") or {}),
        **(raw.get("rope_parameters") or {}),
    }
    if params and all(isinstance(value, Mapping) for value in params.values()):
        raise ValueError("per-layer-type rope_parameters are not supported")
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope type {rope_type!r}; supported: {sorted(SUPPORTED_ROPE_TYPES)}"
        )
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ValueError("partial_rotary_factor other than 1.0 is not supported")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return RopeSpec(rope_type="default", theta=theta)
    if "factor" not in params:
        raise ValueError(f"rope type {rope_type!r} needs a 'factor'")
    if rope_type == "linear":
        return RopeSpec(rope_type="linear", theta=theta, factor=float(params["factor"]))
    return RopeSpec(
        rope_type="llama3",
        theta=theta,
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings") or raw["max_position_embeddings"]
        ),
    )


def _parse_sliding_windows(
    raw: Mapping[str, Any], model_type: str, num_layers: int
) -> tuple[int | None, ...]:
    """Per-layer sliding-window size, None for full attention."""
    window = raw.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        window = None
    layer_types = raw.get("layer_types")
    if layer_types is None:
        if model_type == "mistral":
            layer_types = ["sliding_attention"] * num_layers
        elif model_type in ("qwen2", "qwen3"):
            first_sliding = int(raw.get("max_window_layers", num_layers))
            layer_types = [
                "sliding_attention" if i >= first_sliding else "full_attention"
                for i in range(num_layers)
            ]
        else:
            layer_types = ["full_attention"] * num_layers
    if len(layer_types) != num_layers:
        raise ValueError("layer_types must have one entry per layer")
    windows: list[int | None] = []
    for layer_type in layer_types:
        if layer_type not in ("full_attention", "sliding_attention"):
            raise ValueError(f"unsupported layer type {layer_type!r}")
        is_sliding = layer_type == "sliding_attention" and window is not None
        windows.append(int(window) if is_sliding and window is not None else None)
    return tuple(windows)


def read_eos_token_ids(checkpoint_dir: Path, config: Mapping[str, Any]) -> tuple[int, ...]:
    """EOS ids from generation_config.json and config.json together (chat models add some)."""
    ids: set[int] = set()
    sources: list[Any] = [config.get("eos_token_id")]
    generation_path = checkpoint_dir / "generation_config.json"
    if generation_path.is_file():
        sources.append(json.loads(generation_path.read_text(encoding="utf-8")).get("eos_token_id"))
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(item) for item in value)
    return tuple(sorted(ids))
