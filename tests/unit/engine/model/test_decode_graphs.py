"""Decode steps replayed from graphs: batch-size buckets, padding, static tensors.

The CUDA capture is replaced by one that replays by calling the captured function again,
so everything but the CUDA graph itself runs here: the static tensors must be refilled
before each replay, padding rows must stay out of real sequences' cache, and the logits
must equal those of the same runner's eager steps and of Conveyor's attention.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.decode_graphs import graph_batch_sizes
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.layers.varlen_kernels import (
    FlashAttnVarlen,
    kernel_shape,
)
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.fakes.varlen import checkpoint_stand_in, flash_attn_module

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

NUM_KV_BLOCKS = 64


@pytest.mark.parametrize(
    ("max_batch", "sizes"),
    [(1, [1]), (5, [1, 2, 4, 5]), (8, [1, 2, 4, 8]), (20, [1, 2, 4, 8, 16, 20]),
     (64, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64])],
)  # fmt: skip
def test_batch_sizes(max_batch: int, sizes: list[int]) -> None:
    assert graph_batch_sizes(max_batch) == sizes


def test_no_batch_sizes_below_one() -> None:
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        graph_batch_sizes(0)


class Replaying:
    """A "graph" that replays by calling its function again (captured once, as CUDA's is)."""

    def __init__(self, forward: Callable[[], None]) -> None:
        self.forward = forward
        forward()

    def replay(self) -> None:
        self.forward()


def make_runner(path: Path, block_size: int, kernel_name: str | None, graphs: int) -> ModelRunner:
    kernel = None if kernel_name is None else checkpoint_stand_in(path, block_size, kernel_name)
    return ModelRunner(
        path, num_kv_blocks=NUM_KV_BLOCKS, block_size=block_size, device="cpu",
        dtype="float32", attention_backend="conveyor", varlen_kernel=kernel,
        decode_graph_rows=graphs, graph_capture=Replaying,
    )  # fmt: skip


def decode_run(runner: ModelRunner, block_size: int) -> list[torch.Tensor]:
    """Three prompts prefilled, decoded together (3 rows: a graph padded to 4), then the
    shortest stops and two decode on (2 rows); the logits of every step."""
    per_seq = -(-80 // block_size)
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(3)]
    tokens = [
        [(5 * i + 3 * n) % 500 + 3 for i in range(length)] for n, length in enumerate((9, 3, 14))
    ]
    logits = [
        runner.execute([SeqChunk(tuple(t), 0, tables[n], True) for n, t in enumerate(tokens)])
    ]
    live = [0, 1, 2]
    for step in range(8):
        if step == 4:
            live = [0, 2]
        for row, n in enumerate(live):
            tokens[n].append(int(logits[-1][row].argmax()))
        chunks = [SeqChunk((tokens[n][-1],), len(tokens[n]) - 1, tables[n], True) for n in live]
        logits.append(runner.execute(chunks))
    return logits


@pytest.mark.parametrize(("block_size", "kernel_name"), [(4, "flashinfer"), (256, "flash_attn")])
def test_replayed_decode_steps_give_the_eager_steps_logits(
    llama_path: Path, block_size: int, kernel_name: str
) -> None:
    conveyor = make_runner(llama_path, block_size, None, 0)
    eager = make_runner(llama_path, block_size, kernel_name, 0)
    graphed = make_runner(llama_path, block_size, kernel_name, 4)
    assert graphed.decode_graphs is not None and graphed.decode_graphs.sizes == [1, 2, 4]
    assert eager.decode_graphs is None
    # The scratch block for padding rows lies past the pool.
    assert graphed.kv_cache.shape[2] == NUM_KV_BLOCKS + 1
    assert eager.kv_cache.shape[2] == NUM_KV_BLOCKS
    want = decode_run(conveyor, block_size)
    for candidate in (eager, graphed):
        for expected, actual in zip(want, decode_run(candidate, block_size), strict=True):
            torch.testing.assert_close(actual, expected, atol=2e-4, rtol=2e-4)
    assert graphed.decode_graphs.num_replays == 8  # every decode step; the prefill eager


def test_steps_a_graph_cannot_run_go_eager(llama_path: Path) -> None:
    graphed = make_runner(llama_path, 4, "flashinfer", 2)
    graphs = graphed.decode_graphs
    assert graphs is not None
    one = SeqChunk((5,), 3, (0,), True)
    assert graphs.covers([one, one])
    assert not graphs.covers([one, one, one])  # more rows than the largest graph
    assert not graphs.covers([SeqChunk((5, 6), 0, (0,), True)])  # a prefill chunk
    assert not graphs.covers([])


def test_no_graphs_without_a_varlen_kernel(llama_path: Path) -> None:
    runner = make_runner(llama_path, 4, None, 8)
    assert runner.decode_graphs is None and runner.kv_cache.shape[2] == NUM_KV_BLOCKS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_replay_decode_steps_on_a_gpu(llama_path: Path) -> None:
    """Real CUDA graphs (``cuda_graph_capture``) around the flash-attn stand-in, whose
    decode path is tensor ops alone: the device check runs this on any GPU, with or
    without FlashInfer or flash-attn installed."""
    config = DecoderConfig.from_hf(load_hf_config(llama_path))
    shape = kernel_shape(config, 256, torch.float32, torch.device("cuda"))

    def cuda_runner(graphs: int, kernel: FlashAttnVarlen | None) -> ModelRunner:
        return ModelRunner(
            llama_path, num_kv_blocks=NUM_KV_BLOCKS, block_size=256, device="cuda",
            dtype="float32", attention_backend="conveyor", varlen_kernel=kernel,
            decode_graph_rows=graphs,
        )  # fmt: skip

    conveyor = cuda_runner(0, None)
    graphed = cuda_runner(4, FlashAttnVarlen(flash_attn_module(), shape))
    assert graphed.decode_graphs is not None and graphed.graph_capture_s > 0
    want, got = decode_run(conveyor, 256), decode_run(graphed, 256)
    for expected, actual in zip(want, got, strict=True):
        torch.testing.assert_close(actual, expected, atol=1e-3, rtol=1e-3)
    assert graphed.decode_graphs.num_replays == 8
