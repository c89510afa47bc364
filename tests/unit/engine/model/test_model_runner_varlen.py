"""ModelRunner with a varlen kernel (the GPU path) gives Conveyor's own attention's logits.

The kernels are torch stand-ins of flash-attn and FlashInfer (``conveyor.fakes.varlen``):
this runs the adapters, the step's metadata and the layers' one call a step on a CPU. The
libraries themselves run in the device check, where a GPU is lent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.fakes.checkpoints import build_tiny_mistral
from conveyor.fakes.varlen import checkpoint_stand_in

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

NUM_KV_BLOCKS = 24


@pytest.fixture(scope="module")
def mistral_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sliding-window attention (a window of 16 tokens)."""
    return build_tiny_mistral(tmp_path_factory.mktemp("mistral"))


def runner(path: Path, block_size: int, kernel_name: str | None) -> ModelRunner:
    kernel = None if kernel_name is None else checkpoint_stand_in(path, block_size, kernel_name)
    return ModelRunner(
        path, num_kv_blocks=NUM_KV_BLOCKS, block_size=block_size, device="cpu",
        dtype="float32", attention_backend="conveyor", varlen_kernel=kernel,
    )  # fmt: skip


def steps(runner: ModelRunner, block_size: int, num_decodes: int) -> list[torch.Tensor]:
    """A prompt of 26 in two chunks beside a prompt of 5 and its decodes, then both decode
    greedily together; the logits of every step."""
    blocks_each = -(-64 // block_size)
    tables = [tuple(range(blocks_each)), tuple(range(blocks_each, 2 * blocks_each))]
    long = [(7 * i) % 500 + 3 for i in range(26)]
    short = [9, 4, 8, 6, 5]
    logits = [runner.execute([SeqChunk(tuple(long[:15]), 0, tables[0], False),
                              SeqChunk(tuple(short), 0, tables[1], True)])]  # fmt: skip
    tokens = [long, [*short, int(logits[-1][0].argmax())]]
    logits.append(runner.execute([SeqChunk(tuple(long[15:]), 15, tables[0], True),
                                  SeqChunk((tokens[1][-1],), 5, tables[1], True)]))  # fmt: skip
    for _ in range(num_decodes):
        tokens[0].append(int(logits[-1][0].argmax()))
        tokens[1].append(int(logits[-1][1].argmax()))
        logits.append(
            runner.execute(
                [
                    SeqChunk((seq[-1],), len(seq) - 1, tables[i], True)
                    for i, seq in enumerate(tokens)
                ]
            )
        )
    return logits


@pytest.mark.parametrize(
    ("model", "block_size", "kernel_name"),
    [
        ("llama", 4, "flashinfer"),
        ("mistral", 4, "flashinfer"),
        ("llama", 256, "flash_attn"),
        ("mistral", 256, "flash_attn"),
    ],
)
def test_the_varlen_kernel_gives_conveyors_logits(
    model: str,
    block_size: int,
    kernel_name: str,
    llama_path: Path,
    mistral_path: Path,
) -> None:
    path = llama_path if model == "llama" else mistral_path
    conveyor, varlen = runner(path, block_size, None), runner(path, block_size, kernel_name)
    assert conveyor.varlen_kernel is None
    assert varlen.varlen_kernel is not None and varlen.native_decode is None
    want, got = steps(conveyor, block_size, 6), steps(varlen, block_size, 6)
    for expected, actual in zip(want, got, strict=True):
        torch.testing.assert_close(actual, expected, atol=2e-4, rtol=2e-4)
    # One call a layer a step: no call per sequence or per decode bucket.
    assert varlen.varlen_kernel.num_calls == len(want) * varlen.config.num_layers


def test_a_varlen_step_builds_no_masks_or_buckets(llama_path: Path) -> None:
    varlen = runner(llama_path, 4, "flashinfer")
    chunks = [SeqChunk((5, 6, 7), 0, (0,), True), SeqChunk((8,), 4, (1, 2), True)]
    step = varlen._prepare(chunks)
    assert step.varlen is not None and step.varlen.query_start.tolist() == [0, 3, 4]
    assert step.prefills == () and step.decode is None


def _installed_kernel() -> str | None:
    """The library ``attention_backend: auto`` would take on this machine's GPU, if any."""
    if not torch.cuda.is_available():
        return None
    for name in ("flashinfer", "flash_attn"):
        try:
            __import__(name)
        except ImportError:
            continue
        return name
    return None


@pytest.mark.skipif(_installed_kernel() is None, reason="needs CUDA and flashinfer or flash-attn")
def test_the_installed_kernel_gives_conveyors_logits_on_cuda(mistral_path: Path) -> None:
    """The real library (the device check runs this): bfloat16, so logits are compared
    loosely and the first step's greedy tokens exactly."""
    block_size = 256 if _installed_kernel() == "flash_attn" else 16

    def cuda_runner(backend: str) -> ModelRunner:
        return ModelRunner(
            mistral_path, num_kv_blocks=NUM_KV_BLOCKS, block_size=block_size, device="cuda",
            dtype="bfloat16", attention_backend=backend,  # type: ignore[arg-type]
        )  # fmt: skip

    conveyor, varlen = cuda_runner("conveyor"), cuda_runner("auto")
    assert varlen.varlen_kernel is not None, varlen.attention_reason
    want, got = steps(conveyor, block_size, 6), steps(varlen, block_size, 6)
    assert got[0].argmax(-1).tolist() == want[0].argmax(-1).tolist()
    for expected, actual in zip(want, got, strict=True):
        torch.testing.assert_close(actual, expected, atol=0.1, rtol=0.05)
