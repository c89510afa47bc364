"""Loads a checkpoint, owns the paged KV cache, and runs one engine step on the device.

The scheduler hands over ``SeqChunk``s (see ``step.py``); :meth:`ModelRunner.execute` packs
them into one batch, runs the decoder and returns float32 logits for the chunks that asked
for them. Out-of-memory errors come back as :class:`StepOutOfMemory` /
:class:`KVOutOfMemory`, so callers need not import torch to catch them.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.compiled_layers import compile_layers
from conveyor.engine.model.decode_graphs import DecodeGraphs, GraphCapture, cuda_graph_capture
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config, read_eos_token_ids
from conveyor.engine.model.kv_sizing import (
    KVOutOfMemory,
    kv_cache_bytes_per_token,
    resolve_device,
    resolve_dtype,
)
from conveyor.engine.model.layers.linear import has_packed_projections, prepack_projections
from conveyor.engine.model.layers.mlp import fuse_gated_mlps
from conveyor.engine.model.layers.native_kernels import install_native_kernels
from conveyor.engine.model.layers.paged_attention import (
    CompiledDecodeAttention,
    cache_at_offset,
    compile_decode_attention,
)
from conveyor.engine.model.layers.varlen_kernels import (
    AttentionBackend,
    VarlenKernel,
    install_varlen_kernel,
    kernel_shape,
    select_varlen_kernel,
)
from conveyor.engine.model.llama import LlamaDecoder
from conveyor.engine.model.lora.runtime import LoraRuntime
from conveyor.engine.model.paged_varlen import paged_varlen
from conveyor.engine.model.prompt_scoring import score_rows, scoring_rows
from conveyor.engine.model.row_buckets import (
    bucket_sizes,
    choose_padding_limit,
    padded_rows,
    warm_projections,
)
from conveyor.engine.model.step_builder import decode_batch, plan_on_cpu, varlen_sequences
from conveyor.engine.model.step_inputs import PrefillSpan, StepInput
from conveyor.engine.model.weight_loader import load_weights
from conveyor.engine.outputs import TokenLogprobs
from conveyor.errors import ModelOutOfMemory

__all__ = ["ModelRunner", "StepOutOfMemory"]

_CPU_OOM_MESSAGE = "DefaultCPUAllocator: can't allocate memory"

# The fixed cost of one more decode-attention call, in KV blocks read (see decode_buckets).
# On CPU a call costs about as much as reading 32 blocks (measured); on a GPU, where
# reading a block takes nanoseconds and launching kernels microseconds, far more (a guess,
# not yet measured on a GPU).
DECODE_BUCKET_COST_BLOCKS = {"cpu": 32.0, "cuda": 2048.0}


class StepOutOfMemory(ModelOutOfMemory):
    """The device ran out of memory while running a step; retry with a smaller step."""


def _is_out_of_memory(error: RuntimeError) -> bool:
    """Whether ``error`` is a device or host allocation failure."""
    # CUDA raises torch.OutOfMemoryError; the CPU allocator raises a plain RuntimeError.
    return isinstance(error, torch.OutOfMemoryError) or _CPU_OOM_MESSAGE in str(error)


class ModelRunner:
    """One model on one device with its paged KV cache; runs engine steps.

    ``num_kv_blocks`` blocks of ``block_size`` tokens are allocated per layer for K and for
    V, shaped ``[num_kv_blocks, block_size, num_kv_heads, head_dim]`` (see
    :func:`num_kv_blocks_for_tokens` / :func:`num_kv_blocks_for_memory_fraction` to size
    it). ``batch_decode`` attends the single-token (decode) chunks of a step together,
    bucketed by context length, instead of one call each; ``decode_bucket_cost_blocks``
    is a bucket's fixed cost in blocks read (default: by device, see ``decode_buckets``).
    ``prepack_weights`` gives projections on the CPU oneDNN-blocked weights in place of
    their own (see ``Linear.prepack``; only a tied output projection keeps both copies).
    ``native_kernels`` gives CPU decode rows Conveyor's C++ attention and eager steps its
    fused norms, SiLU and RoPE (PyTorch's where it cannot be built). ``enforce_eager`` False
    compiles the decoder layers (``compiled_layers``) and, without the native kernel, the
    CPU decode attention (``paged_attention``) at start-up (:attr:`compile_s`; CPU, no LoRA).
    ``attention_backend`` picks the GPU's varlen kernel (``varlen_kernels``: ``auto``,
    ``flashinfer``, ``flash_attn``, or ``conveyor`` for none); ``varlen_kernel`` gives one
    directly. A varlen kernel attends every layer's whole step in one call, and turns the
    CPU's native decode attention and compiled layers off. ``decode_graph_rows`` (0: none)
    captures decode steps of up to that many rows as CUDA graphs at load, with a varlen
    kernel and no LoRA (``decode_graphs``; :attr:`graph_capture_s`); ``graph_capture``
    replaces the CUDA capture (tests). ``row_buckets_up_to`` pads eager CPU steps of up to
    that many rows to row buckets (``row_buckets``; None: measured by
    :meth:`warm_row_buckets`, every step until then; 0: none).
    """

    def __init__(
        self,
        checkpoint_dir: str | Path,
        *,
        num_kv_blocks: int,
        block_size: int = 16,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        batch_decode: bool = True,
        decode_bucket_cost_blocks: float | None = None,
        lora: LoraRuntime | None = None,
        prepack_weights: bool = True,
        enforce_eager: bool = True,
        native_kernels: bool = True,
        attention_backend: AttentionBackend = "auto",
        varlen_kernel: VarlenKernel | None = None,
        decode_graph_rows: int = 0,
        graph_capture: GraphCapture | None = None,
        row_buckets_up_to: int | None = None,
    ) -> None:
        if num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_kv_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.checkpoint_dir = Path(checkpoint_dir)
        raw_config = load_hf_config(self.checkpoint_dir)
        self.config = DecoderConfig.from_hf(raw_config)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.batch_decode = batch_decode
        self.prepack_weights = prepack_weights
        # Steps of up to this many rows are padded where ``pad_rows``; every step until
        # ``warm_row_buckets`` measures the limit, unless it is given.
        self.measure_pad_limit = row_buckets_up_to is None
        self.pad_up_to = sys.maxsize if row_buckets_up_to is None else row_buckets_up_to
        self.decode_bucket_cost_blocks = DECODE_BUCKET_COST_BLOCKS.get(self.device.type, 2048.0)
        if decode_bucket_cost_blocks is not None:
            self.decode_bucket_cost_blocks = decode_bucket_cost_blocks
        self.eos_token_ids = read_eos_token_ids(self.checkpoint_dir, raw_config)
        self.last_prepare_s = 0.0  # of the last execute (see step.PrepareTimed)
        # Of the last execute, one per chunk with scoring (see step.ScoresPrompts).
        self.last_prompt_scores: list[tuple[TokenLogprobs, ...]] = []
        self.model = self._load_model(fuse_mlp=enforce_eager and lora is None)
        # Multi-LoRA: chunks with an adapter_id get that adapter's delta (see engine/lora).
        self.lora = lora
        if lora is not None:
            lora.attach(self.model)
        self.varlen_kernel, self.attention_reason = self._varlen(attention_backend, varlen_kernel)
        capture = self._graph_capturer(decode_graph_rows, graph_capture)
        # The whole allocation (the second KV tier copies blocks of it) and its per-layer
        # views; with decode graphs, one scratch block past the pool for their padding rows.
        self.kv_cache = self._allocate_kv_cache(num_kv_blocks + (capture is not None))
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_cache]
        self.decode_graphs: DecodeGraphs | None = None
        self.graph_capture_s = 0.0
        self._cpu_kernels(native_kernels, enforce_eager, decode_bucket_cost_blocks is None)
        if capture is not None:
            self._capture_graphs(capture, decode_graph_rows)

    def _cpu_kernels(self, native_kernels: bool, enforce_eager: bool, cost_unset: bool) -> None:
        """Conveyor's native kernels and the compiled layers, where they apply (a CPU, no
        varlen kernel; compiled: no LoRA either), and whether steps are padded."""
        on_cpu = self.device.type == "cpu" and self.varlen_kernel is None
        self.pad_rows = False  # until the kernels are in (compiling runs steps)
        native = native_kernels and on_cpu
        self.native_decode = install_native_kernels(self.model) if native else None
        if self.native_decode is not None and cost_unset:
            self.decode_bucket_cost_blocks = math.inf  # hidden padding costs it next to nothing
        self.compiled_decode: CompiledDecodeAttention | None = None
        self.compile_s = 0.0
        if not enforce_eager and on_cpu and self.lora is None:
            if self.native_decode is None:
                self.compiled_decode, self.compile_s = compile_decode_attention(
                    self.model, self.kv_caches[0]
                )
            self.compile_s += compile_layers(self)
        # Eager steps through packed projections are padded to row buckets (see
        # ``row_buckets``); not with LoRA (its rows are the step's tokens) or compiled layers.
        self.pad_rows = (
            on_cpu and self.lora is None and self.model.compiled_layers is None
            and has_packed_projections(self.model)
        )  # fmt: skip

    def _capture_graphs(self, capture: GraphCapture, max_batch: int) -> None:
        """Capture the decode graphs (padding rows in the scratch block past the pool)."""
        if self.varlen_kernel is None:
            raise RuntimeError("decode graphs need a varlen kernel")
        started_s = time.perf_counter()
        with torch.inference_mode():
            self.decode_graphs = DecodeGraphs(
                self.model, self.kv_caches, self.varlen_kernel, max_batch=max_batch,
                max_model_len=self.max_model_len, scratch_block=self.num_kv_blocks,
                capture=capture,
            )  # fmt: skip
        self.graph_capture_s = time.perf_counter() - started_s

    def _graph_capturer(self, max_batch: int, capture: GraphCapture | None) -> GraphCapture | None:
        """How decode graphs are captured, or None where there are none: ``max_batch`` 0,
        no varlen kernel, LoRA, or no capture given off CUDA."""
        if max_batch < 1 or self.varlen_kernel is None or self.lora is not None:
            return None
        if capture is None and self.device.type == "cuda":
            return cuda_graph_capture(self.device)
        return capture

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head: the width of the logits."""
        return self.config.vocab_size

    @property
    def max_model_len(self) -> int:
        """Longest sequence (prompt plus output) the model supports."""
        return self.config.max_position_embeddings

    @property
    def kv_cache_bytes(self) -> int:
        """Device memory the KV cache occupies."""
        per_token = kv_cache_bytes_per_token(self.config, self.dtype)
        return per_token * self.num_kv_blocks * self.block_size

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """Run one step; float32 logits [num chunks needing logits, vocab], in chunk order.

        Chunks with ``scoring`` also get their positions scored, in
        :attr:`last_prompt_scores`. Raises ValueError for a chunk that breaks the contract
        (empty, past ``max_model_len``, block table too short or out of range, unknown token
        id) and :class:`StepOutOfMemory` when the device runs out of memory; the step can
        then be retried smaller, since every slot it had written is written again.
        """
        self.last_prompt_scores = []
        if not chunks:
            return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.device)
        for chunk in chunks:
            self._check_chunk(chunk)
        try:
            with torch.inference_mode():
                logits = self._run(chunks)
            if self.device.type == "cuda":
                # Sampling waits for the logits anyway; waiting here puts the model's time
                # in the step's forward phase, not in whatever reads the logits first.
                torch.cuda.synchronize(self.device)
            return logits
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise StepOutOfMemory(
                f"out of device memory running a step of {len(chunks)} sequences and "
                f"{sum(len(chunk.token_ids) for chunk in chunks)} tokens"
            ) from error

    def warm_row_buckets(self, max_rows: int) -> int:
        """Generate oneDNN's kernels for every row bucket of steps up to ``max_rows`` rows
        now (see ``row_buckets``), one decoder layer's projections each (the layers share
        their shapes); returns how many buckets (0 where steps are not padded). With
        ``row_buckets_up_to`` None, first measures up to which row count padding pays
        (``choose_padding_limit``): buckets only up to there."""
        if not self.pad_rows:
            return 0
        layer = self.model.decoder_layers[0]
        hidden = self.config.hidden_size
        attention = layer.self_attn
        parts = [(attention.qkv_proj, hidden), (attention.o_proj, self.config.q_size),
                 (layer.mlp, hidden)]  # fmt: skip
        if self.measure_pad_limit:
            layers = len(self.model.decoder_layers)
            self.pad_up_to = choose_padding_limit(parts, layers, max_rows)
        buckets = bucket_sizes(min(max_rows, self.pad_up_to))
        warm_projections(parts, buckets)
        return len(buckets)

    def _run(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """The forward pass (inside inference mode): logits, and scores where asked."""
        if self.decode_graphs is not None and self.decode_graphs.covers(chunks):
            hidden = self.decode_graphs.run(chunks)
            self.last_prepare_s = self.decode_graphs.last_fill_s
            rows = [row for row, chunk in enumerate(chunks) if chunk.needs_logits]
            return self.model.logits(hidden[rows]).to(torch.float32)
        started_s = time.perf_counter()
        step = self._prepare(chunks)
        self.last_prepare_s = time.perf_counter() - started_s
        if self.lora is not None:
            self.lora.begin_step(chunks)
        try:
            hidden = self.model.hidden_states(step, self.kv_caches)
        finally:
            if self.lora is not None:
                self.lora.end_step()
        # Only rows that need logits go through the final norm and the (large) LM head.
        logits = self.model.logits(hidden[step.logits_indices]).to(torch.float32)
        scoring = scoring_rows(chunks)
        if len(scoring):
            self.last_prompt_scores = score_rows(self.model.logits, hidden, scoring)
        return logits

    def _varlen(
        self, choice: AttentionBackend, kernel: VarlenKernel | None
    ) -> tuple[VarlenKernel | None, str]:
        """Install ``kernel``, or the one ``choice`` selects, in every layer (see
        ``varlen_kernels``); returns it (None: Conveyor's attention) and why."""
        if kernel is not None:
            reason = f"{kernel.name} (given)"
        else:
            shape = kernel_shape(self.config, self.block_size, self.dtype, self.device)
            kernel, reason = select_varlen_kernel(choice, shape)
        if kernel is not None:
            attentions = [layer.self_attn for layer in self.model.decoder_layers]
            install_varlen_kernel(attentions, self.config.sliding_windows, kernel)
        return kernel, reason

    def _load_model(self, *, fuse_mlp: bool) -> LlamaDecoder:
        """Build the decoder on the device and fill it from the checkpoint (``fuse_mlp``:
        with packed weights, the MLPs' SiLU and product fused into their matmuls)."""
        try:
            model = LlamaDecoder(self.config, device=self.device, dtype=self.dtype)
            load_weights(model, self.config, self.checkpoint_dir)
            if self.prepack_weights:
                if fuse_mlp:
                    fuse_gated_mlps(model)
                prepack_projections(model)
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise KVOutOfMemory(f"the model weights do not fit on {self.device}") from error
        return model.eval()

    def _allocate_kv_cache(self, num_blocks: int) -> torch.Tensor:
        """One zeroed allocation for every layer's K and V, [layers, 2, blocks, ...]."""
        shape = (
            self.config.num_layers,
            2,
            num_blocks,
            self.block_size,
            self.config.num_kv_heads,
            self.config.head_dim,
        )
        try:
            # Zeroed, not empty: padded decode attention reads unused slots with weight 0,
            # and 0 * NaN from uninitialised memory would still poison the output.
            # Off storage offset 0, so one compiled decode attention serves every layer.
            cache = cache_at_offset(shape, self.dtype, self.device)
        except RuntimeError as error:
            if not _is_out_of_memory(error):
                raise
            raise KVOutOfMemory(
                f"a KV cache of {self.num_kv_blocks} blocks does not fit on {self.device}"
            ) from error
        return cache

    def _check_chunk(self, chunk: SeqChunk) -> None:
        """Reject chunks that would index outside the cache or the vocabulary."""
        if not chunk.token_ids:
            raise ValueError("a chunk needs at least one token")
        if chunk.start_pos < 0:
            raise ValueError(f"start_pos must be >= 0, got {chunk.start_pos}")
        if chunk.end_pos > self.max_model_len:
            raise ValueError(f"end_pos {chunk.end_pos} exceeds max_model_len {self.max_model_len}")
        num_blocks_needed = math.ceil(chunk.end_pos / self.block_size)
        if len(chunk.block_table) < num_blocks_needed:
            raise ValueError(
                f"block_table has {len(chunk.block_table)} blocks; positions up to "
                f"{chunk.end_pos} need {num_blocks_needed}"
            )
        used_blocks = chunk.block_table[:num_blocks_needed]
        if min(used_blocks) < 0 or max(used_blocks) >= self.num_kv_blocks:
            raise ValueError(f"block ids must be in [0, {self.num_kv_blocks})")
        if chunk.adapter_id and self.lora is None:
            raise ValueError("this model serves no LoRA adapters")
        # Checked here because an out-of-range embedding index is a fatal device assert on CUDA.
        if min(chunk.token_ids) < 0 or max(chunk.token_ids) >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        scoring = chunk.scoring
        if scoring is not None:
            if not chunk.start_pos <= scoring.first_pos < scoring.end_pos <= chunk.end_pos:
                raise ValueError("scored positions must lie inside the chunk")
            if min(scoring.target_ids) < 0 or max(scoring.target_ids) >= self.vocab_size:
                raise ValueError(f"scored token ids must be in [0, {self.vocab_size})")
            if not 0 <= scoring.num_top <= self.vocab_size:
                raise ValueError(f"num_top must be in [0, {self.vocab_size}]")

    def _prepare(self, chunks: Sequence[SeqChunk]) -> StepInput:
        """Build the step's index tensors on the host, then move them in one copy each."""
        plan = plan_on_cpu(chunks, self.block_size, self.batch_decode)
        to_device = self._to_device
        varlen = None
        prefills: tuple[PrefillSpan, ...] = ()
        decode = None
        if self.varlen_kernel is not None:  # one kernel call: no spans, buckets or masks
            host = paged_varlen(varlen_sequences(chunks), self.block_size)
            varlen = host.to(self.device)
            self.varlen_kernel.plan(varlen, host)
        else:
            prefills = tuple(
                self._prefill_span(start, chunk) for start, chunk in plan.prefill_chunks
            )
            cost = self.decode_bucket_cost_blocks
            decode = decode_batch(plan.decode_chunks, self.block_size, cost, to_device)
        rows = len(plan.input_ids)
        if self.pad_rows and rows <= self.pad_up_to:
            # padding rows: token 0 at position 0, never written or attended
            padding = [0] * (padded_rows(rows) - rows)
            plan.input_ids.extend(padding)
            plan.positions.extend(padding)
        return StepInput(
            input_ids=to_device(torch.tensor(plan.input_ids, dtype=torch.int64)),
            positions=to_device(torch.tensor(plan.positions, dtype=torch.int64)),
            slot_mapping=to_device(torch.tensor(plan.slot_mapping, dtype=torch.int64)),
            prefills=prefills,
            decode=decode,
            logits_indices=to_device(torch.tensor(plan.logits_indices, dtype=torch.int64)),
            varlen=varlen,
        )

    def _prefill_span(self, token_start: int, chunk: SeqChunk) -> PrefillSpan:
        """A chunk attended on its own (its cached context's blocks on the device)."""
        return PrefillSpan(
            token_start=token_start,
            token_end=token_start + len(chunk.token_ids),
            start_pos=chunk.start_pos,
            context_blocks=None if chunk.start_pos == 0 else self._to_device(self._blocks(chunk)),
        )

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Copy a host index tensor to the model's device."""
        return tensor.to(self.device, non_blocking=True)

    def _blocks(self, chunk: SeqChunk) -> torch.Tensor:
        """The blocks holding positions ``0 .. end_pos - 1`` of one sequence."""
        num_blocks = math.ceil(chunk.end_pos / self.block_size)
        return torch.tensor(chunk.block_table[:num_blocks], dtype=torch.int64)
