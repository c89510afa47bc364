"""Decoder layers compiled one region each: norms, RoPE, residuals and SiLU fused by inductor.

Eagerly a decoder layer launches some forty small ops around its four projections and its
attention (float32 casts and reductions of two RMSNorms, RoPE's slices and products, the
residual adds, the gated SiLU). Compiled, they become a handful of fused loops. The
projections and the attention are not traced: each is an opaque op (``opaque_ops``) that
runs the eager module, so oneDNN's packed weights, the KV-cache writes and the paged
decode attention stay as they are. Every layer's region is the same graph — the layer's
norm weights are its inputs and its ops' slots are tensors — traced once at start-up with
a dynamic token count, so one compile serves all layers and every step of two or more
tokens. After that a call never compiles: one its guards reject raises inside dynamo
(the "fail_on_recompile" stance) and that layer and the rest run eagerly, counted in
``num_fallbacks``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.layers.attention import Attention
from conveyor.engine.model.layers.linear import Linear
from conveyor.engine.model.layers.native_kernels import native_decode_attention
from conveyor.engine.model.layers.opaque_ops import (
    register,
    step_context,
    step_state,
    write_kv_op,
)
from conveyor.engine.model.layers.paged_attention import warm_up_sizes
from conveyor.engine.model.step_inputs import AttentionMasks, StepInput

if TYPE_CHECKING:
    from conveyor.engine.model.llama import DecoderLayer
    from conveyor.engine.model.model_runner import ModelRunner

__all__ = [
    "MIN_COMPILED_TOKENS",
    "CompiledLayers",
    "LayerSteps",
    "compile_layers",
    "decode_inputs",
    "general_options",
    "kv_pair",
    "warm_up_steps",
]

# Dynamo specialises a size of 0 or 1: a step of one token runs eager.
MIN_COMPILED_TOKENS = 2

# The token count the graph is traced at: none of a small model's fixed sizes.
WARM_UP_TOKENS = 7

# The decode region's loops run on one thread: they are small (a few rows of the hidden size),
# and waking a second OpenMP thread for each took longer than the loop (80-140 us against
# 10-35 us, PASSIVE wait policy). Block tables are checked by the runner before a step, so
# the loops skip re-checking every indirect index.
INDUCTOR_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {
    "cpp.threads": 1,
    "assert_indirect_indexing": False,
}

# How dynamo's "fail_on_recompile" stance words the RuntimeError it raises.
_RECOMPILE_MESSAGE = "Detected recompile"

KvCache = tuple[torch.Tensor, torch.Tensor]


@dataclass(slots=True)
class LayerSteps:
    """What the attention ops of one step read: the step, each layer's cache and masks."""

    step: StepInput
    kv_caches: Sequence[KvCache]
    masks: Sequence[AttentionMasks]


def general_options() -> dict[str, str | int | bool | Callable[..., Any]]:
    """The general region's options: its loops (prefill chunks of up to thousands of tokens)
    run on every torch thread; 16 prompts of 128 SmolLM2 tokens prefilled in 0.73-0.74 s
    against 0.83-0.90 s on one of two threads."""
    return {**INDUCTOR_OPTIONS, "cpp.threads": torch.get_num_threads()}


def compile_layers(runner: ModelRunner) -> float:
    """Give the runner's layers one compiled region each, traced on ``warm_up_steps`` whose
    cache writes are then cleared; returns the seconds (0 where the cache is too small).
    Decode steps then attend in one bucket: the decode region takes exactly one."""
    started_s = time.perf_counter()
    steps = warm_up_steps(runner.config, runner.block_size, runner.num_kv_blocks)
    if steps is None:
        return 0.0
    runner.model.compiled_layers = CompiledLayers(
        runner.model.decoder_layers, native=runner.native_decode is not None
    )
    runner.decode_bucket_cost_blocks = math.inf
    for chunks in steps:
        runner.execute(chunks)
    runner.kv_cache.zero_()
    return time.perf_counter() - started_s


def warm_up_steps(
    config: DecoderConfig, block_size: int, num_kv_blocks: int
) -> list[list[SeqChunk]] | None:
    """Steps that trace both regions: a prefill of ``WARM_UP_TOKENS`` tokens, then decode
    rows in one bucket, at sizes clear of the model's fixed ones (so that no coincidence
    becomes a guard); None where the cache has too few blocks for them."""
    fixed = {block_size, config.num_heads, config.num_kv_heads, config.head_dim}
    rows, width = warm_up_sizes(fixed, block_size)
    if max(width, -(-WARM_UP_TOKENS // block_size)) > num_kv_blocks:
        return None
    table = tuple(range(width))
    end = width * block_size
    prefill = [SeqChunk(tuple(range(WARM_UP_TOKENS)), 0, table, needs_logits=True)]
    decode = [SeqChunk((row,), end - 1 - row % block_size, table, True) for row in range(rows)]
    return [prefill, decode]


def _traced_layer(
    layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """One decoder layer as the compiler sees it (``DecoderLayer.traced_forward``)."""
    out: torch.Tensor = layer.traced_forward(h, cos, sin)
    return out


def _traced_decode_layer(
    layer: DecoderLayer,
    h: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
    native: bool,
) -> torch.Tensor:
    """One decoder layer on a step of decode rows only, attention included: the keys and
    values are written to the cache, then attended by the native kernel where ``native``
    (read in place, opaque to the compiler), else by ``gathered_decode_attention``.
    Row ``i`` is token ``i``: ``block_tables`` [T, n] and ``mask`` [T, n, block_size]."""
    attn = layer.self_attn
    q, k, v = attn.project(layer.input_layernorm(h), (cos, sin))
    write_kv_op(kv_cache, slots, k, v)
    attend = native_decode_attention if native else gathered_decode_attention
    attended = attend(q, kv_cache[0], kv_cache[1], block_tables, mask)
    h = h + attn.o_proj(attended.flatten(1))
    mixed: torch.Tensor = layer.mlp(layer.post_attention_layernorm(h))
    return h + mixed


def gathered_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Decode attention for the compiled region; returns [b, heads, dim].

    Shapes as ``paged_decode_attention``. Each row's blocks are gathered once into
    [b * kv_heads, len, dim] (one fused copy), so that the scores and the weighted values
    are two batched matmuls of each KV head's group of queries: inductor's own loops for
    the in-place form reduce every score across the vector lanes, and measured slower.
    """
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    length = block_tables.shape[1] * k_cache.shape[1]
    # [b, n, block_size, kv_heads, dim] -> [b, kv_heads, len, dim], copied once.
    keys = (
        k_cache[block_tables].permute(0, 3, 1, 2, 4).reshape(rows * num_kv_heads, length, head_dim)
    )
    values = (
        v_cache[block_tables].permute(0, 3, 1, 2, 4).reshape(rows * num_kv_heads, length, head_dim)
    )
    queries = (q * head_dim**-0.5).view(rows * num_kv_heads, group, head_dim)
    scores = torch.bmm(queries, keys.mT).to(torch.float32).view(rows, num_kv_heads, group, length)
    scores = scores + mask.view(rows, 1, 1, length).to(torch.float32)
    probs = torch.softmax(scores, dim=-1).to(q.dtype).view(rows * num_kv_heads, group, length)
    return torch.bmm(probs, values).view(rows, num_heads, head_dim)


def _attend(
    attention: Attention, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Layer ``index``'s attention over the running step (what its ``attend_op`` runs)."""
    state: LayerSteps = step_state()
    return attention.attend(q, k, v, state.step, state.kv_caches[index], state.masks[index])


class CompiledLayers:
    """Runs a decoder's layers through one compiled region each (see the module's doc)."""

    def __init__(self, layers: Iterable[DecoderLayer], *, native: bool = False) -> None:
        self.layers = list(layers)
        # Decode rows attend with the native kernel (``native_kernels``) where it is loaded.
        self.native = native
        for index, layer in enumerate(self.layers):
            for module in layer.modules():
                if isinstance(module, Linear):
                    module.op_slot = register(module.eager_forward)
                elif isinstance(module, Attention):
                    module.op_slot = register(partial(_attend, module, index))
        self._compiled: Callable[..., torch.Tensor] = torch.compile(
            _traced_layer, dynamic=False, options=general_options()
        )
        self._compiled_decode: Callable[..., torch.Tensor] = torch.compile(
            _traced_decode_layer, dynamic=False, options=INDUCTOR_OPTIONS
        )
        self.traced_decode = False
        self.num_calls = 0
        self.traced = False
        self.num_fallbacks = 0

    def run(
        self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], state: LayerSteps
    ) -> tuple[torch.Tensor, int]:
        """Run the layers compiled from the first on; returns the hidden states and how many
        layers ran (fewer than all where a call would have recompiled: run the rest eager)."""
        if h.shape[0] < MIN_COMPILED_TOKENS:
            return h, 0
        decode = decode_inputs(state)
        traced = self.traced if decode is None else self.traced_decode
        stance = "default" if not traced else "fail_on_recompile"
        done = 0
        with step_context(state), torch.compiler.set_stance(stance):
            for index, layer in enumerate(self.layers):
                self.num_calls += 1
                try:
                    h = self._call(index, layer, h, rope, state, decode, traced)
                except RuntimeError as error:
                    if not str(error).startswith(_RECOMPILE_MESSAGE):
                        raise
                    self.num_fallbacks += 1
                    break
                done += 1
        if decode is None:
            self.traced = True
        else:
            self.traced_decode = True
        return h, done

    def _call(
        self,
        index: int,
        layer: DecoderLayer,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        state: LayerSteps,
        decode: _DecodeInputs | None,
        traced: bool,
    ) -> torch.Tensor:
        """One layer's region (the first call traces it, with the token count dynamic)."""
        cos, sin = rope
        if decode is None:
            args = [h, cos, sin]
            compiled = self._compiled
        else:
            tables, mask = decode.for_layer(state.masks[index])
            kv_cache = decode.kv_caches[index]
            args = [h, cos, sin, kv_cache, state.step.slot_mapping, tables, mask]
            compiled = partial(self._compiled_decode, native=self.native)
        if not traced:
            for tensor in args:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
            if decode is not None:
                torch._dynamo.maybe_mark_dynamic(args[-2], 1)
                torch._dynamo.maybe_mark_dynamic(args[-1], 1)
        return compiled(layer, *args)


class _DecodeInputs:
    """A decode-only step's block tables and masks in token order, for the decode region."""

    def __init__(
        self, token_indices: torch.Tensor, tables: torch.Tensor, kv_caches: list[torch.Tensor]
    ) -> None:
        self.token_indices = token_indices
        self.kv_caches = kv_caches
        self.tables = tables.new_empty(tables.shape).index_copy_(0, token_indices, tables)
        self._masks: dict[int, torch.Tensor] = {}

    def for_layer(self, masks: AttentionMasks) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables and the layer's mask [T, n, block_size] (one per distinct mask)."""
        mask = masks.decode[0]
        if mask is None:
            raise ValueError("a decode bucket without a mask")
        key = id(mask)
        if key not in self._masks:
            rows, width = self.tables.shape
            by_row = mask.view(rows, width, -1)
            self._masks[key] = by_row.new_empty(by_row.shape).index_copy_(
                0, self.token_indices, by_row
            )
        return self.tables, self._masks[key]


def decode_inputs(state: LayerSteps) -> _DecodeInputs | None:
    """The decode region's inputs where the step is decode rows only, in one bucket of at
    least ``MIN_COMPILED_TOKENS`` blocks; else None (the general region runs)."""
    step = state.step
    if step.prefills or step.decode is None or len(step.decode.buckets) != 1:
        return None
    tables = step.decode.buckets[0].block_tables
    if tables.shape[1] < MIN_COMPILED_TOKENS:
        return None
    kv_caches = [kv_pair(*kv_cache) for kv_cache in state.kv_caches]
    if any(kv_cache is None for kv_cache in kv_caches):
        return None
    return _DecodeInputs(step.decode.token_indices, tables, kv_caches)  # type: ignore[arg-type]


def kv_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor | None:
    """K and V as one view [2, ...] of their storage, where V lies at a fixed distance
    after K with the same shape and strides (as the runner allocates them); else None."""
    same_storage = k_cache.untyped_storage().data_ptr() == v_cache.untyped_storage().data_ptr()
    distance = v_cache.storage_offset() - k_cache.storage_offset()
    if not same_storage or distance <= 0 or k_cache.shape != v_cache.shape:
        return None
    if k_cache.stride() != v_cache.stride():
        return None
    return k_cache.as_strided(
        (2, *k_cache.shape), (distance, *k_cache.stride()), k_cache.storage_offset()
    )
