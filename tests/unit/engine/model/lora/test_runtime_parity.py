"""Multi-LoRA through the whole engine: greedy output for each adapter equals PEFT's merged
model under Hugging Face ``generate``, token for token, with 4 adapters and the base mixed
in the same steps; and the prefix cache never hands one adapter's KV to another."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.lora.registry import AdapterEntry
from conveyor.engine.model.lora.runtime import LoraRuntime, new_lora_runtime
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.stream import GenerationStream
from conveyor.engine.tokenizer import Tokenizer
from tests.unit.model_helpers import (
    HFReference,
    collect,
    engine_config,
    merged_reference,
    random_prompts,
    wait_idle,
)

# Building PEFT adapters (peft's first import included) takes seconds on a busy machine.
pytestmark = [pytest.mark.anyio, pytest.mark.model, pytest.mark.timeout(120)]

VOCAB_SIZE = 512
NUM_ADAPTERS = 4
MAX_TOKENS = 10


@contextmanager
def lora_engine(path: Path, config: EngineConfig) -> Iterator[tuple[LLMEngine, LoraRuntime]]:
    """A started engine whose runner serves LoRA adapters."""
    lora = new_lora_runtime(
        DecoderConfig.from_hf(load_hf_config(path)),
        slots=config.max_loras_per_batch or 1,
        max_cpu_loras=2,
        max_rank=16,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    runner = ModelRunner(
        path, num_kv_blocks=config.num_kv_blocks, block_size=config.block_size, device="cpu",
        lora=lora,
    )  # fmt: skip
    engine = LLMEngine(runner, Tokenizer(path), config)
    engine.start()
    try:
        yield engine, lora
    finally:
        engine.stop()


def submit(
    engine: LLMEngine, prompt: list[int], adapter: AdapterEntry | None, request_id: str
) -> GenerationStream:
    """Queue one greedy request with ``adapter`` (None: the base)."""
    stream = GenerationStream()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    adapter_id = 0 if adapter is None else adapter.adapter_id
    request = engine.new_request(request_id, prompt, params, adapter_id=adapter_id)
    engine.add_request(request, stream)
    return stream


@pytest.mark.parametrize("slots", [NUM_ADAPTERS, 2])
async def test_mixed_adapters_match_peft_merged_models(
    llama_path: Path, adapter_dirs: list[Path], llama_reference: HFReference, slots: int
) -> None:
    """With 2 slots the scheduler holds adapters back and the device LRU evicts."""
    config = engine_config(max_loras_per_batch=slots)
    prompts = random_prompts([5, 9, 14, 7, 11, 6, 13, 8, 10, 12], VOCAB_SIZE, seed=3)
    with lora_engine(llama_path, config) as (engine, lora):
        entries = [lora.registry.load(f"a{index}", path) for index, path in enumerate(adapter_dirs)]
        choices: list[AdapterEntry | None] = [None, *entries]
        # Every prompt under every adapter and the base, all queued at once: steps mix them.
        jobs = [(p, c) for p in prompts for c in choices]
        streams = [submit(engine, p, c, f"r{i}") for i, (p, c) in enumerate(jobs)]
        results = await asyncio.gather(*(collect(stream) for stream in streams))
        await wait_idle(engine)
        assert engine.num_used_blocks == 0
        assert len(lora.resident_ids) <= slots
        # Host copies beyond max_cpu_loras (2) were read from disk again: still exact.
        assert lora.registry.num_host_copies <= 2
    references = [llama_reference] + [merged_reference(llama_path, d) for d in adapter_dirs]
    by_choice = {id(choice): ref for choice, ref in zip(choices, references, strict=True)}
    for (prompt, choice), result in zip(jobs, results, strict=True):
        expected = by_choice[id(choice)].generate(prompt, MAX_TOKENS)
        assert result.token_ids == expected, (choice, prompt)
    # The adapters really change the output, or this test could not fail.
    width = len(choices)
    for column in range(1, width):
        changed = [
            results[row + column].token_ids != results[row].token_ids
            for row in range(0, len(results), width)
        ]
        assert any(changed), f"adapter {column - 1} changes no output"


async def test_prefix_cache_is_keyed_by_adapter(llama_path: Path, adapter_dirs: list[Path]) -> None:
    config = engine_config(max_loras_per_batch=2)
    prompt = random_prompts([17], VOCAB_SIZE, seed=5)[0]
    with lora_engine(llama_path, config) as (engine, lora):
        first = lora.registry.load("first", adapter_dirs[0])
        second = lora.registry.load("second", adapter_dirs[1])
        cached: list[int] = []
        for index, choice in enumerate([first, second, None, first, second, None]):
            result = await collect(submit(engine, prompt, choice, f"s{index}"))
            cached.append(result.outputs[-1].num_cached_tokens)
            await wait_idle(engine)
    # First sight of the prompt under each adapter (and the base): no hit; then hits.
    assert cached[:3] == [0, 0, 0]
    assert all(hit > 0 for hit in cached[3:])
