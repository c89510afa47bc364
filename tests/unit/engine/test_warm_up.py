"""The engine thread's warm-up step: its placeholder prompts, and that it never stops an
engine from serving."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch

from conveyor.engine.core.engine_config import EngineConfig
from conveyor.engine.core.step import SeqChunk
from conveyor.engine.model.model_runner import StepOutOfMemory
from conveyor.engine.warm_up import prepare_engine_thread, warm_up_chunks


def test_prompts_fill_the_tokens_on_blocks_of_their_own() -> None:
    chunks = warm_up_chunks(
        2048, max_model_len=600, block_size=16, num_kv_blocks=1000, vocab_size=50
    )
    assert [len(chunk.token_ids) for chunk in chunks] == [600, 600, 600, 248]
    blocks = [block for chunk in chunks for block in chunk.block_table]
    assert blocks == list(range(len(blocks)))  # disjoint, from block 0 up
    for chunk in chunks:
        assert chunk.start_pos == 0 and chunk.needs_logits
        assert len(chunk.block_table) == -(-len(chunk.token_ids) // 16)
        assert all(0 <= token < 50 for token in chunk.token_ids)


def test_a_small_kv_cache_caps_the_warm_up() -> None:
    chunks = warm_up_chunks(2048, max_model_len=4096, block_size=16, num_kv_blocks=10, vocab_size=9)
    assert [len(chunk.token_ids) for chunk in chunks] == [160]
    assert warm_up_chunks(0, max_model_len=64, block_size=16, num_kv_blocks=10, vocab_size=9) == ()


class _Runner:
    def __init__(self, error: Exception | None = None) -> None:
        self.steps: list[Sequence[SeqChunk]] = []
        self.error = error

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return ()

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        self.steps.append(chunks)
        if self.error is not None:
            raise self.error
        return torch.zeros(len(chunks), 4)


def _config(chunks: tuple[SeqChunk, ...]) -> EngineConfig:
    return EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                        num_kv_blocks=8, block_size=16, warm_up_chunks=chunks)  # fmt: skip


def test_the_warm_up_runs_once_as_one_step() -> None:
    chunks = warm_up_chunks(40, max_model_len=16, block_size=16, num_kv_blocks=8, vocab_size=9)
    runner = _Runner()
    prepare_engine_thread(_config(chunks), runner)
    assert runner.steps == [chunks]
    prepare_engine_thread(_config(()), runner)  # none configured: no step
    assert len(runner.steps) == 1


@pytest.mark.parametrize(
    "error",
    [StepOutOfMemory("out of device memory running a step"), RuntimeError("a kernel failed")],
)
def test_a_failed_warm_up_is_logged_not_raised(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """The runner's own out-of-memory error (a ConveyorError, not a RuntimeError) too: it
    would otherwise end the engine thread before its first request."""
    chunks = warm_up_chunks(8, max_model_len=16, block_size=16, num_kv_blocks=8, vocab_size=9)
    with caplog.at_level(logging.WARNING, logger="conveyor.engine.warm_up"):
        prepare_engine_thread(_config(chunks), _Runner(error))
    assert f"serving without it: {error}" in caplog.text


class _BucketRunner(_Runner):
    """A runner that pads steps to row buckets: records each bucket warm-up asked of it."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.bucket_error = error
        self.warmed: list[int] = []

    def warm_row_buckets(self, max_rows: int) -> int:
        self.warmed.append(max_rows)
        if self.bucket_error is not None:
            raise self.bucket_error
        return 3


def _bucket_config(chunks: tuple[SeqChunk, ...], rows: int) -> EngineConfig:
    return EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                        num_kv_blocks=8, block_size=16, warm_up_chunks=chunks,
                        warm_up_rows=rows)  # fmt: skip


def test_row_buckets_are_warmed_after_the_step_up_to_warm_up_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chunks = warm_up_chunks(8, max_model_len=16, block_size=16, num_kv_blocks=8, vocab_size=9)
    runner = _BucketRunner()
    with caplog.at_level(logging.INFO, logger="conveyor.engine.warm_up"):
        prepare_engine_thread(_bucket_config(chunks, 512), runner)
    assert runner.steps == [chunks] and runner.warmed == [512]
    assert "3 row buckets" in caplog.text
    prepare_engine_thread(_bucket_config((), 0), runner)  # 0: no bucket warm-up
    assert runner.warmed == [512]
    prepare_engine_thread(_bucket_config((), 96), runner)  # buckets without a step
    assert runner.warmed == [512, 96] and len(runner.steps) == 1


def test_a_failed_bucket_warm_up_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    runner = _BucketRunner(RuntimeError("could not create a primitive"))
    with caplog.at_level(logging.WARNING, logger="conveyor.engine.warm_up"):
        prepare_engine_thread(_bucket_config((), 128), runner)
    assert "row-bucket warm-up failed, serving without it: could not create" in caplog.text
