"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) that attends over a paged KV cache.

We run our own PyTorch decoder instead of driving Hugging Face's modeling code: attention
reads keys and values straight out of the block-paged cache, every token of a step goes
through one batched matmul per projection, and nothing breaks when transformers changes its
cache API. The config comes from ``hf_config``, the blocks from ``layers/``, the weights
from ``weight_loader``; this module only stacks them.

Shapes: a step packs all sequences' new tokens into one ``[T, hidden]`` tensor (see
``step_inputs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from conveyor.engine.model.compiled_layers import CompiledLayers, LayerSteps
from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.layers import fused_ops
from conveyor.engine.model.layers.attention import Attention
from conveyor.engine.model.layers.embedding import Embedding
from conveyor.engine.model.layers.linear import Linear
from conveyor.engine.model.layers.mlp import MLP
from conveyor.engine.model.layers.norm import RMSNorm
from conveyor.engine.model.layers.opaque_ops import attend_op
from conveyor.engine.model.layers.rotary import inverse_frequencies, rope_angles
from conveyor.engine.model.step_inputs import AttentionMasks, StepInput, build_masks

__all__ = ["DecoderLayer", "LlamaDecoder"]


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = Attention(config, device=device, dtype=dtype)
        self.mlp = MLP(config, device=device, dtype=dtype)
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, device=device, dtype=dtype)

    def forward(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        step: StepInput,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        masks: AttentionMasks,
    ) -> torch.Tensor:
        """Run the block on the step's hidden states [T, hidden]."""
        attended: torch.Tensor = self.self_attn(
            self.input_layernorm(h), rope, step, kv_cache, masks
        )
        h = h + attended
        mixed: torch.Tensor = self.mlp(self.post_attention_layernorm(h))
        return h + mixed

    def traced_forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``forward`` as ``compiled_layers`` traces it: the projections and the attention are
        opaque ops (``opaque_ops``), and attention finds the step in ``step_context``."""
        attn = self.self_attn
        if attn.op_slot is None:
            raise RuntimeError("traced_forward needs the layer's ops registered")
        q, k, v = attn.project(self.input_layernorm(h), (cos, sin))
        h = h + attn.o_proj(attend_op(q, k, v, attn.op_slot))
        mixed: torch.Tensor = self.mlp(self.post_attention_layernorm(h))
        return h + mixed


class _Backbone(nn.Module):
    """Embeddings, decoder layers and final norm (Hugging Face's ``model.*``)."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, device=device, dtype=dtype
        )
        self.layers = nn.ModuleList(
            DecoderLayer(config, device=device, dtype=dtype) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device=device, dtype=dtype)


class LlamaDecoder(nn.Module):
    """The whole causal LM: ``forward(step, kv_caches)`` returns logits for the chosen tokens."""

    def __init__(self, config: DecoderConfig, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.model = _Backbone(config, device=device, dtype=dtype)
        self.lm_head = Linear(
            config.hidden_size, config.vocab_size, bias=False, device=device, dtype=dtype
        )
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Computed on the CPU like the reference implementation, then moved, so the angles
        # match it bit for bit.
        self.inv_freq = inverse_frequencies(config.rope, config.head_dim).to(device)
        # Set by ``compile_layers``: the layers run through one compiled region each.
        self.compiled_layers: CompiledLayers | None = None

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """The decoder layers, in order."""
        return [layer for layer in self.model.layers if isinstance(layer, DecoderLayer)]

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
        # Only rows that need logits go through the final norm and the (large) LM head.
        return self.logits(self.hidden_states(step, kv_caches)[step.logits_indices])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] of hidden states [rows, hidden] from ``hidden_states``."""
        logits: torch.Tensor = self.lm_head(self.model.norm(hidden))
        return logits

    def hidden_states(
        self, step: StepInput, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Run the decoder layers over the step; the last layer's output [T, hidden] (the
        step's tokens; rows of ``row_buckets``' padding past them are dropped)."""
        hidden = self._layers(step, kv_caches)
        return hidden[: step.slot_mapping.shape[0]]

    def _layers(
        self, step: StepInput, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Every row of ``step.input_ids`` through the decoder layers."""
        h = self.model.embed_tokens(step.input_ids)
        rope = rope_angles(step.positions, self.inv_freq, h.dtype)
        masks = self._masks(step, kv_caches[0][0].shape[1], h)
        done = 0
        if self.compiled_layers is not None:
            h, done = self.compiled_layers.run(h, rope, LayerSteps(step, kv_caches, masks))
        layers = self.decoder_layers[done:]
        if layers and fused_ops.eager_native(layers[0].input_layernorm.native):
            return _fused_residuals(h, layers, rope, step, kv_caches[done:], masks[done:])
        for index in range(done, len(self.model.layers)):
            h = self.model.layers[index](h, rope, step, kv_caches[index], masks[index])
        hidden: torch.Tensor = h
        return hidden

    def _masks(self, step: StepInput, block_size: int, like: torch.Tensor) -> list[AttentionMasks]:
        """Each layer's masks, built once per distinct window (none where a varlen kernel
        attends the step: it masks by positions itself)."""
        windows = self.config.sliding_windows
        if step.varlen is not None:
            return [AttentionMasks([], [], [])] * len(windows)
        by_window = {window: build_masks(step, window, block_size, like) for window in set(windows)}
        return [by_window[window] for window in windows]


def _fused_residuals(
    h: torch.Tensor,
    layers: Sequence[DecoderLayer],
    rope: tuple[torch.Tensor, torch.Tensor],
    step: StepInput,
    kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    masks: Sequence[AttentionMasks],
) -> torch.Tensor:
    """``layers`` over ``h`` as their ``forward`` runs them, each residual add fused into
    the RMSNorm that follows it (the layer's second norm, or the next layer's first):
    one pass over the hidden states where the add and the norm took two."""
    residual, x = h, layers[0].input_layernorm(h)
    for index, layer in enumerate(layers):
        attended = layer.self_attn(x, rope, step, kv_caches[index], masks[index])
        norm = layer.post_attention_layernorm
        residual, x = fused_ops.add_rms_norm(residual, attended, norm.weight, norm.eps)
        mixed = layer.mlp(x)
        if index + 1 == len(layers):
            break
        norm = layers[index + 1].input_layernorm
        residual, x = fused_ops.add_rms_norm(residual, mixed, norm.weight, norm.eps)
    last: torch.Tensor = residual + mixed
    return last
