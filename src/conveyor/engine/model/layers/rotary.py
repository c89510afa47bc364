"""Rotary position embeddings: frequencies (plain, linear, Llama 3 scaled) and rotation."""

from __future__ import annotations

import math

import torch

from conveyor.engine.model.hf_config import RopeSpec

__all__ = ["apply_rope", "inverse_frequencies", "rope_angles"]


def inverse_frequencies(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """The float32 inverse frequencies, one per rotated pair of channels."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(rope, inv_freq)
    return inv_freq


def _llama3_scaled(rope: RopeSpec, inv_freq: torch.Tensor) -> torch.Tensor:
    """Llama 3.1 scaling: stretch long wavelengths, keep short ones, blend in between."""
    original_len = rope.original_max_position_embeddings
    long_wavelen = original_len / rope.low_freq_factor
    short_wavelen = original_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > long_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (original_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < short_wavelen) * ~(wavelen > long_wavelen)
    return torch.where(is_medium, blended, scaled)


def rope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, head_dim] for the step's positions, computed in float32."""
    freqs = positions[:, None].to(torch.float32) * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, head_dim] by per-token angles ``cos``/``sin`` [T, 1, head_dim]."""
    return (x * cos) + (_rotate_half(x) * sin)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Swap the two halves of the last dimension, negating the new first half."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
