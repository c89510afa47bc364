"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) that attends over a paged KV cache.

We run our own PyTorch decoder instead of driving Hugging Face's modeling code: attention
reads keys and values straight out of the block-paged cache, every token of a step goes
through one batched matmul per projection, and nothing breaks when transformers changes its
cache API. The module names mirror Hugging Face's so checkpoints load by parameter name; only
q/k/v and gate/up are packed into one matrix each (one matmul instead of three or two).

Shapes: a step packs all sequences' new tokens into one ``[T, hidden]`` tensor. Each layer's
KV cache is a pair of tensors ``[num_blocks, block_size, num_kv_heads, head_dim]``; the slot
of position ``p`` of a sequence is ``block_table[p // block_size] * block_size + p %
block_size``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "DecodeBatch",
    "DecoderConfig",
    "LlamaDecoder",
    "PrefillSeq",
    "RopeSpec",
    "StepInput",
    "grouped_attention",
    "load_hf_config",
]

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3"})

# HF projections we pack into one matrix: name -> (packed module name, shard index).
_PACKED_SHARDS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary embedding settings read from ``rope_parameters`` / ``rope_scaling``."""

    rope_type: str
    theta: float
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0

    def inverse_frequencies(self, head_dim: int) -> torch.Tensor:
        """The float32 inverse frequencies, one per rotated pair of channels."""
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        if self.rope_type == "linear":
            return inv_freq / self.factor
        if self.rope_type == "llama3":
            return self._llama3_scaled(inv_freq)
        return inv_freq

    def _llama3_scaled(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """Llama 3.1 scaling: stretch long wavelengths, keep short ones, blend in between."""
        original_len = self.original_max_position_embeddings
        long_wavelen = original_len / self.low_freq_factor
        short_wavelen = original_len / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > long_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (original_len / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * scaled / self.factor + smooth * scaled
        is_medium = ~(wavelen < short_wavelen) * ~(wavelen > long_wavelen)
        return torch.where(is_medium, blended, scaled)


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
    """Read ``config.json`` from a checkpoint directory."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {checkpoint_dir}")
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


# --------------------------------------------------------------------------- step input


@dataclass(frozen=True, slots=True)
class PrefillSeq:
    """One sequence attended on its own: its tokens are ``[token_start, token_end)`` of the step.

    ``context_slots`` holds the cache slots of positions ``0 .. end_pos - 1``; it is None
    when ``start_pos == 0``, since then the keys are exactly this step's new tokens.
    """

    token_start: int
    token_end: int
    start_pos: int
    context_slots: torch.Tensor | None

    @property
    def query_len(self) -> int:
        """Number of new tokens (queries)."""
        return self.token_end - self.token_start

    @property
    def end_pos(self) -> int:
        """Context length the queries attend over."""
        return self.start_pos + self.query_len


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """Sequences with one new token each, attended together with padded contexts.

    ``token_indices`` [B] picks their tokens out of the step; ``context_slots`` [B, L] holds
    each one's cache slots padded to the longest context; ``query_positions`` [B] is each
    new token's position (its context length minus one).
    """

    token_indices: torch.Tensor
    context_slots: torch.Tensor
    query_positions: torch.Tensor


@dataclass(frozen=True, slots=True)
class StepInput:
    """Everything one forward pass needs, already on the model's device."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    prefills: tuple[PrefillSeq, ...]
    decode: DecodeBatch | None
    logits_indices: torch.Tensor


@dataclass(slots=True)
class _Masks:
    """Boolean attention masks (True = may attend) for one sliding-window setting."""

    prefill: list[torch.Tensor | None]
    decode: torch.Tensor | None


def _build_masks(step: StepInput, window: int | None, device: torch.device) -> _Masks:
    """Masks for every group of the step; None where a plain causal mask does."""
    prefill: list[torch.Tensor | None] = []
    for seq in step.prefills:
        is_window_binding = window is not None and window < seq.end_pos
        if seq.start_pos == 0 and not is_window_binding:
            prefill.append(None)
            continue
        # Query i sits at position start_pos + i and may see keys 0 .. start_pos + i:
        # the mask is causal aligned to the bottom right, not SDPA's top-left is_causal.
        query_pos = torch.arange(seq.start_pos, seq.end_pos, device=device)[:, None]
        key_pos = torch.arange(seq.end_pos, device=device)[None, :]
        prefill.append(_causal_window_mask(query_pos, key_pos, window))
    decode = None
    if step.decode is not None:
        query_pos = step.decode.query_positions[:, None]
        key_pos = torch.arange(step.decode.context_slots.shape[1], device=device)[None, :]
        # [B, L] -> [B, 1 (heads), 1 (query), L]; padding keys lie past the query position.
        decode = _causal_window_mask(query_pos, key_pos, window)[:, None, None, :]
    return _Masks(prefill=prefill, decode=decode)


def _causal_window_mask(
    query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None
) -> torch.Tensor:
    """``key <= query`` and, with a window, ``key > query - window`` (as Hugging Face)."""
    mask = key_pos <= query_pos
    if window is not None:
        mask = mask & (key_pos > query_pos - window)
    return mask


# --------------------------------------------------------------------------- layers


def _empty_param(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised parameter: every value is overwritten from the checkpoint."""
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


class _Linear(nn.Module):
    """``y = x W^T + b`` with weights left uninitialised (random init of a big model is slow)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = _empty_param(out_features, in_features, device=device, dtype=dtype)
        self.bias = _empty_param(out_features, device=device, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the projection."""
        return F.linear(x, self.weight, self.bias)


class _RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back, as the reference models do."""

    def __init__(self, size: int, eps: float, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _empty_param(size, device=device, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise over the last dimension."""
        in_dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(in_dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Swap the two halves of the last dimension, negating the new first half."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, head_dim] by per-token angles ``cos``/``sin`` [T, 1, head_dim]."""
    return (x * cos) + (_rotate_half(x) * sin)


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    can_repeat_kv: bool | None = None,
) -> torch.Tensor:
    """SDPA over [B, heads, len, dim] with fewer KV heads; causal when ``mask`` is None.

    ``can_repeat_kv`` (default: on CUDA) lets a masked call repeat KV heads to match the
    query heads.
    """
    if can_repeat_kv is None:
        can_repeat_kv = q.device.type == "cuda"
    num_groups = q.shape[-3] // k.shape[-3]
    if num_groups > 1 and mask is not None and can_repeat_kv:
        # On CUDA only the flash and math kernels take grouped heads, and flash takes no
        # mask: repeating KV heads lets the memory-efficient kernel run instead of the math
        # one, which would materialise every score in float32. On CPU grouped heads with a
        # mask are fast as they are, and repeating measured slower.
        k = k.repeat_interleave(num_groups, dim=-3)
        v = v.repeat_interleave(num_groups, dim=-3)
        num_groups = 1
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=num_groups > 1
    )


class _Attention(nn.Module):
    """Grouped-query self-attention that writes to and reads from the paged KV cache."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.split_sizes = (config.q_size, config.kv_size, config.kv_size)
        self.qkv_proj = _Linear(
            config.hidden_size,
            config.q_size + 2 * config.kv_size,
            bias=config.has_qkv_bias,
            device=device,
            dtype=dtype,
        )
        self.o_proj = _Linear(
            config.q_size, config.hidden_size, bias=config.has_o_bias, device=device, dtype=dtype
        )
        self.q_norm: _RMSNorm | None = None
        self.k_norm: _RMSNorm | None = None
        if config.has_qk_norm:
            self.q_norm = _RMSNorm(config.head_dim, config.rms_norm_eps, device=device, dtype=dtype)
            self.k_norm = _RMSNorm(config.head_dim, config.rms_norm_eps, device=device, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        step: StepInput,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        masks: _Masks,
    ) -> torch.Tensor:
        """Attend for all T tokens of the step; returns [T, hidden]."""
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.split_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        # Flat views: one row per cache slot, so a slot number indexes a row directly.
        k_slots = kv_cache[0].view(-1, self.num_kv_heads, self.head_dim)
        v_slots = kv_cache[1].view(-1, self.num_kv_heads, self.head_dim)
        # Write first: a chunk's own keys must be visible to its own queries.
        k_slots.index_copy_(0, step.slot_mapping, k)
        v_slots.index_copy_(0, step.slot_mapping, v)
        out = torch.empty_like(q)
        for seq, mask in zip(step.prefills, masks.prefill, strict=True):
            out[seq.token_start : seq.token_end] = self._attend_prefill(
                q, k, v, seq, mask, k_slots, v_slots
            )
        if step.decode is not None and masks.decode is not None:
            decoded = self._attend_decode(q, step.decode, masks.decode, k_slots, v_slots)
            out.index_copy_(0, step.decode.token_indices, decoded)
        projected: torch.Tensor = self.o_proj(out.view(num_tokens, self.num_heads * self.head_dim))
        return projected

    def _attend_prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seq: PrefillSeq,
        mask: torch.Tensor | None,
        k_slots: torch.Tensor,
        v_slots: torch.Tensor,
    ) -> torch.Tensor:
        """One sequence's chunk against its whole context; returns [q_len, heads, head_dim]."""
        if seq.context_slots is None:
            keys = k[seq.token_start : seq.token_end]
            values = v[seq.token_start : seq.token_end]
        else:
            # index_select copies whole rows; plain indexing is far slower on CPU.
            keys = k_slots.index_select(0, seq.context_slots)
            values = v_slots.index_select(0, seq.context_slots)
        # [len, heads, dim] -> [1, heads, len, dim] as SDPA expects.
        out = grouped_attention(
            q[seq.token_start : seq.token_end].transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            mask,
        )
        return out[0].transpose(0, 1)

    def _attend_decode(
        self,
        q: torch.Tensor,
        decode: DecodeBatch,
        mask: torch.Tensor,
        k_slots: torch.Tensor,
        v_slots: torch.Tensor,
    ) -> torch.Tensor:
        """All single-token sequences at once; returns [B, heads, head_dim]."""
        batch, max_len = decode.context_slots.shape
        flat_slots = decode.context_slots.view(-1)
        # [B * L, kv_heads, dim] -> [B, kv_heads, L, dim]
        keys = k_slots.index_select(0, flat_slots).view(batch, max_len, self.num_kv_heads, -1)
        values = v_slots.index_select(0, flat_slots).view(batch, max_len, self.num_kv_heads, -1)
        out = grouped_attention(
            q.index_select(0, decode.token_indices).unsqueeze(2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            mask,
        )
        return out.squeeze(2)


class _MLP(nn.Module):
    """SiLU-gated feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = _Linear(
            config.hidden_size,
            2 * config.intermediate_size,
            bias=config.has_mlp_bias,
            device=device,
            dtype=dtype,
        )
        self.down_proj = _Linear(
            config.intermediate_size,
            config.hidden_size,
            bias=config.has_mlp_bias,
            device=device,
            dtype=dtype,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP."""
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


class _DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = _Attention(config, device=device, dtype=dtype)
        self.mlp = _MLP(config, device=device, dtype=dtype)
        eps = config.rms_norm_eps
        self.input_layernorm = _RMSNorm(config.hidden_size, eps, device=device, dtype=dtype)
        self.post_attention_layernorm = _RMSNorm(
            config.hidden_size, eps, device=device, dtype=dtype
        )

    def forward(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        step: StepInput,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        masks: _Masks,
    ) -> torch.Tensor:
        """Run the block on the step's hidden states [T, hidden]."""
        attended: torch.Tensor = self.self_attn(
            self.input_layernorm(h), rope, step, kv_cache, masks
        )
        h = h + attended
        mixed: torch.Tensor = self.mlp(self.post_attention_layernorm(h))
        return h + mixed


class _Embedding(nn.Module):
    """Token embedding table (Hugging Face's ``embed_tokens``)."""

    def __init__(
        self, vocab_size: int, hidden_size: int, *, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.weight = _empty_param(vocab_size, hidden_size, device=device, dtype=dtype)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Look up the rows for ``token_ids``."""
        return F.embedding(token_ids, self.weight)


class _Backbone(nn.Module):
    """Embeddings, decoder layers and final norm (Hugging Face's ``model.*``)."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = _Embedding(
            config.vocab_size, config.hidden_size, device=device, dtype=dtype
        )
        self.layers = nn.ModuleList(
            _DecoderLayer(config, device=device, dtype=dtype) for _ in range(config.num_layers)
        )
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps, device=device, dtype=dtype)


class LlamaDecoder(nn.Module):
    """The whole causal LM: ``forward(step, kv_caches)`` returns logits for the chosen tokens."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.model = _Backbone(config, device=device, dtype=dtype)
        self.lm_head = _Linear(
            config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype
        )
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Computed on the CPU like the reference implementation, then moved, so the angles
        # match it bit for bit.
        self.inv_freq = config.rope.inverse_frequencies(config.head_dim).to(device)

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype."""
        return self.model.embed_tokens.weight.dtype

    def forward(
        self, step: StepInput, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Run one step; returns logits [len(step.logits_indices), vocab] in the model dtype."""
        h = self.model.embed_tokens(step.input_ids)
        rope = self._rope_angles(step.positions, h.dtype)
        masks = {
            window: _build_masks(step, window, h.device)
            for window in set(self.config.sliding_windows)
        }
        for layer, window, kv_cache in zip(
            self.model.layers, self.config.sliding_windows, kv_caches, strict=True
        ):
            h = layer(h, rope, step, kv_cache, masks[window])
        # Only rows that need logits go through the final norm and the (large) LM head.
        last = self.model.norm(h[step.logits_indices])
        logits: torch.Tensor = self.lm_head(last)
        return logits

    def _rope_angles(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, head_dim] for the step's positions, computed in float32."""
        freqs = positions[:, None].to(torch.float32) * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]

    def load_weights(self, checkpoint_dir: str | Path) -> None:
        """Copy every parameter from the checkpoint's safetensors files (sharded or not)."""
        from safetensors import safe_open

        params = dict(self.named_parameters())
        expected = {name: self._shard_count(name) for name in params}
        loaded: set[tuple[str, int | None]] = set()
        for file in _safetensors_files(Path(checkpoint_dir)):
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for hf_name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                    target = self._map_name(hf_name)
                    if target is None:
                        continue
                    name, shard = target
                    if name not in params:
                        raise ValueError(f"unexpected weight {hf_name!r} in {file.name}")
                    tensor = handle.get_tensor(hf_name)
                    self._copy_weight(params[name], name, shard, tensor, hf_name)
                    loaded.add(target)
        missing = [
            name
            for name, count in expected.items()
            for shard in (range(count) if count else [None])
            if (name, shard) not in loaded
        ]
        if missing:
            raise ValueError(f"checkpoint {checkpoint_dir} lacks weights for: {missing[:8]}")

    def _map_name(self, hf_name: str) -> tuple[str, int | None] | None:
        """Our parameter name (and packed shard) for a checkpoint tensor; None to skip it."""
        if hf_name.endswith("rotary_emb.inv_freq"):
            return None  # old checkpoints saved this buffer; we compute it
        if hf_name == "lm_head.weight" and self.config.tie_word_embeddings:
            return None  # some tied checkpoints still carry a copy
        parts = hf_name.split(".")
        for index, part in enumerate(parts):
            if part in _PACKED_SHARDS:
                packed, shard = _PACKED_SHARDS[part]
                return ".".join([*parts[:index], packed, *parts[index + 1 :]]), shard
        return hf_name, None

    def _shard_count(self, name: str) -> int:
        """How many checkpoint tensors fill this parameter (0 means one, unpacked)."""
        if ".qkv_proj." in name:
            return 3
        if ".gate_up_proj." in name:
            return 2
        return 0

    def _shard_sizes(self, name: str) -> tuple[int, ...]:
        """Row counts of each packed shard of a parameter."""
        if ".qkv_proj." in name:
            return (self.config.q_size, self.config.kv_size, self.config.kv_size)
        return (self.config.intermediate_size, self.config.intermediate_size)

    def _copy_weight(
        self,
        param: nn.Parameter,
        name: str,
        shard: int | None,
        tensor: torch.Tensor,
        hf_name: str,
    ) -> None:
        """Copy a checkpoint tensor into a parameter (or its packed rows), converting dtype."""
        dest = param.data
        if shard is not None:
            sizes = self._shard_sizes(name)
            dest = dest.narrow(0, sum(sizes[:shard]), sizes[shard])
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
