"""Starting the engine: ``start`` returns once the engine thread has run its warm-up, so a
server is ready only when its first request meets generated kernels."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from conveyor.engine.core.step import SeqChunk
from conveyor.engine.llm_engine import LLMEngine
from conveyor.engine.tokenizer import Tokenizer
from conveyor.engine.warm_up import warm_up_chunks
from conveyor.errors import ServiceUnavailable
from tests.unit.model_helpers import GREEDY, engine_config, submit, wait_idle

pytestmark = pytest.mark.model


class _HeldRunner:
    """A runner whose steps wait until the test releases them."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.steps: list[Sequence[SeqChunk]] = []

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return ()

    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        self.entered.set()
        assert self.release.wait(10), "the test never released the step"
        self.steps.append(chunks)
        return torch.zeros(len(chunks), 4)


def test_start_returns_only_after_the_warm_up_step(llama_path: Path) -> None:
    config = engine_config()
    chunks = warm_up_chunks(
        40, max_model_len=16, block_size=4, num_kv_blocks=config.num_kv_blocks, vocab_size=9
    )
    config = dataclasses.replace(config, warm_up_chunks=chunks)
    runner = _HeldRunner()
    engine = LLMEngine(runner, Tokenizer(llama_path), config)
    starter = threading.Thread(target=engine.start)
    starter.start()
    try:
        assert runner.entered.wait(10)
        starter.join(0.2)
        assert starter.is_alive()  # still in start: the warm-up step has not finished
        runner.release.set()
        starter.join(10)
        assert not starter.is_alive()
        assert runner.steps == [chunks]
    finally:
        runner.release.set()
        starter.join(10)
        engine.stop()


@pytest.mark.anyio
async def test_a_failed_preparation_lets_start_return_and_refuses_work(
    llama_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("no such cores")

    monkeypatch.setattr("conveyor.engine.llm_engine.prepare_engine_thread", broken)
    engine = LLMEngine(_HeldRunner(), Tokenizer(llama_path), engine_config())
    starter = threading.Thread(target=engine.start)
    starter.start()
    starter.join(10)
    try:
        assert not starter.is_alive()
        await wait_idle(engine)
        with pytest.raises(ServiceUnavailable):  # refused, not queued for a thread that is gone
            submit(engine, [1, 2, 3], GREEDY, request_id="after")
    finally:
        engine.stop()
