"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step on a GPU launches a few hundred small kernels (every op of every layer) for
a few dozen rows: the launches, not the arithmetic, can set its time. At load, the runner
captures the decoder's forward pass over a decode step once per batch size in
``graph_batch_sizes`` (1, 2, 4, then every 8 up to ``max_num_seqs``); a step of ``n``
rows then copies its inputs into the graph's static tensors, padded to the smallest size
that holds it, and replays that graph: one launch for the whole forward pass.

- Padding rows decode token 0 at position 0 into a scratch block that no sequence owns
  (the runner allocates it past the pool), so they touch no real sequence's cache.
- The varlen kernel (``varlen_kernels``) reads the step from static tensors: flash-attn
  reads them in place, FlashInfer's CUDA-graph decode wrapper copies its pages into them
  when planned before each replay. Its context bound is the model's length, fixed at capture.
- Only the decoder layers are in the graph; the LM head runs after, on the real rows.

Steps with a prefill chunk, scored positions or a LoRA adapter, or more rows than the
largest graph, run eagerly as before. The capture itself is a parameter (``GraphCapture``):
``cuda_graph_capture`` on a GPU; the CPU tests pass one that replays by calling again, which
runs everything here but the CUDA graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.layers.varlen_kernels import VarlenKernel
from conveyor.engine.model.llama import LlamaDecoder
from conveyor.engine.model.paged_varlen import PagedVarlen, VarlenSequence, paged_varlen
from conveyor.engine.model.step_inputs import StepInput

__all__ = [
    "DecodeGraphs",
    "Graph",
    "GraphCapture",
    "cuda_graph_capture",
    "graph_batch_sizes",
]


class Graph(Protocol):
    """A captured forward pass: replaying it reruns it on its static tensors' contents."""

    def replay(self) -> None:
        """Run the captured work again."""


GraphCapture = Callable[[Callable[[], None]], Graph]


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 below ``max_batch``, then ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    candidates = [1, 2, 4, *range(8, max_batch, 8)]
    return [size for size in candidates if size < max_batch] + [max_batch]


def cuda_graph_capture(device: torch.device) -> GraphCapture:
    """Capture on ``device``'s current stream, every graph in one memory pool (captured
    largest first, the smaller ones reuse its memory). Each function runs once on a side
    stream first, so that lazy initialisation and autotuning stay out of the graph."""
    pool = torch.cuda.graph_pool_handle()

    def capture(forward: Callable[[], None]) -> Graph:
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side.wait_stream(current)
        with torch.cuda.stream(side):
            forward()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            forward()
        return graph

    return capture


class DecodeGraphs:
    """The captured decode steps of one model and KV cache, and their static tensors."""

    def __init__(
        self,
        model: LlamaDecoder,
        kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        kernel: VarlenKernel,
        *,
        max_batch: int,
        max_model_len: int,
        scratch_block: int,
        capture: GraphCapture,
    ) -> None:
        self._model, self._kv_caches, self._kernel = model, kv_caches, kernel
        self._block_size = kv_caches[0][0].shape[1]
        self._scratch_block = scratch_block
        self.sizes = graph_batch_sizes(max_batch)
        self._buffers = _StaticBuffers(
            self.sizes[-1], -(-max_model_len // self._block_size), model, max_model_len
        )
        self._graphs: dict[int, Graph] = {}
        self.num_replays = 0
        self.last_fill_s = 0.0  # of the last run: the step's host work and copies
        for size in reversed(self.sizes):
            kernel.prepare_graph(size, self._buffers.varlen(size))
            self._fill([], size)  # every row padding: a valid step to capture
            self._graphs[size] = capture(self._forward_pass(size))

    def covers(self, chunks: Sequence[SeqChunk]) -> bool:
        """Whether a graph can run this step: single-token chunks, no scoring, no adapter,
        no more rows than the largest graph."""
        return 0 < len(chunks) <= self.sizes[-1] and all(
            len(chunk.token_ids) == 1 and chunk.scoring is None and not chunk.adapter_id
            for chunk in chunks
        )

    def run(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """The step's last-layer hidden states [len(chunks), hidden], by replaying the
        smallest graph that holds it."""
        started_s = time.perf_counter()
        size = next(size for size in self.sizes if size >= len(chunks))
        self._fill(chunks, size)
        self.last_fill_s = time.perf_counter() - started_s
        self._graphs[size].replay()
        self.num_replays += 1
        return self._buffers.hidden[: len(chunks)]

    def _fill(self, chunks: Sequence[SeqChunk], size: int) -> None:
        """Copy the step, padded to ``size`` rows, into the static tensors, and plan the
        kernel for it."""
        padding = size - len(chunks)
        scratch = (self._scratch_block,)
        sequences = [VarlenSequence(1, c.end_pos, c.block_table) for c in chunks]
        sequences += [VarlenSequence(1, 1, scratch)] * padding
        host = paged_varlen(sequences, self._block_size)
        slots = [
            c.block_table[c.start_pos // self._block_size] * self._block_size
            + c.start_pos % self._block_size
            for c in chunks
        ]
        self._buffers.fill(
            token_ids=[c.token_ids[0] for c in chunks] + [0] * padding,
            positions=[c.start_pos for c in chunks] + [0] * padding,
            slots=slots + [self._scratch_block * self._block_size] * padding,
            host=host,
        )
        self._kernel.plan_graph(size, host)

    def _forward_pass(self, size: int) -> Callable[[], None]:
        """The work a graph of ``size`` rows captures: the layers into the static output."""
        step = self._buffers.step(size)
        hidden = self._buffers.hidden

        def forward() -> None:
            hidden[:size].copy_(self._model.hidden_states(step, self._kv_caches))

        return forward


class _StaticBuffers:
    """The tensors every graph reads and writes, sized for the largest; a graph of ``b``
    rows uses their first ``b`` rows."""

    def __init__(
        self, max_batch: int, max_blocks: int, model: LlamaDecoder, max_model_len: int
    ) -> None:
        device = model.device

        def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = zeros(max_batch, dtype=torch.int64)
        self.positions = zeros(max_batch, dtype=torch.int64)
        self.slot_mapping = zeros(max_batch, dtype=torch.int64)
        self.hidden = zeros(max_batch, model.config.hidden_size, dtype=model.dtype)
        self._all = PagedVarlen(
            query_start=torch.arange(max_batch + 1, dtype=torch.int32, device=device),
            context_start=zeros(max_batch + 1),
            context_lens=zeros(max_batch),
            block_table=zeros(max_batch, max_blocks),
            page_start=zeros(max_batch + 1),
            page_ids=zeros(max_batch * max_blocks),
            last_page_len=zeros(max_batch),
            max_query_len=1,
            max_context_len=max_model_len,
        )
        self._no_logits = zeros(0, dtype=torch.int64)

    def varlen(self, size: int) -> PagedVarlen:
        """A graph's view of the kernel's tensors (one query a row; the pages whole)."""
        whole = self._all
        return PagedVarlen(
            query_start=whole.query_start[: size + 1],
            context_start=whole.context_start[: size + 1],
            context_lens=whole.context_lens[:size],
            block_table=whole.block_table[:size],
            page_start=whole.page_start[: size + 1],
            page_ids=whole.page_ids,
            last_page_len=whole.last_page_len[:size],
            max_query_len=1,
            max_context_len=whole.max_context_len,
        )

    def step(self, size: int) -> StepInput:
        """A graph's step: its rows of the inputs and the kernel's view."""
        return StepInput(
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            slot_mapping=self.slot_mapping[:size],
            prefills=(),
            decode=None,
            logits_indices=self._no_logits,
            varlen=self.varlen(size),
        )

    def fill(
        self, *, token_ids: list[int], positions: list[int], slots: list[int], host: PagedVarlen
    ) -> None:
        """Copy a padded step's host values into the first rows (one copy per tensor)."""
        size = len(token_ids)

        def put(target: torch.Tensor, values: torch.Tensor) -> None:
            target.copy_(values, non_blocking=True)

        put(self.input_ids[:size], torch.tensor(token_ids, dtype=torch.int64))
        put(self.positions[:size], torch.tensor(positions, dtype=torch.int64))
        put(self.slot_mapping[:size], torch.tensor(slots, dtype=torch.int64))
        whole = self._all
        put(whole.context_start[: size + 1], host.context_start)
        put(whole.context_lens[:size], host.context_lens)
        width = host.block_table.shape[1]
        put(whole.block_table[:size, :width], host.block_table)
        put(whole.page_start[: size + 1], host.page_start)
        put(whole.page_ids[: host.page_ids.shape[0]], host.page_ids)
        put(whole.last_page_len[:size], host.last_page_len)
