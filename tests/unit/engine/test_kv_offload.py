"""The engine with a second KV tier: resumed sessions restore their evicted prefix, and
greedy outputs are the same with the tier on and off (tiny random Llama, CPU)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from conveyor.engine.core.kv_tier import Restore, TierIndex, TierOp
from conveyor.engine.kv_offload import KVOffload
from conveyor.engine.llm_engine import EngineConfig, LLMEngine
from conveyor.engine.model.kv_store import HostKVStore, TransferBytes
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.engine.sampling.params import SamplingParams
from conveyor.engine.tokenizer import Tokenizer
from conveyor.errors import ModelFault
from tests.unit.model_helpers import (
    collect,
    engine_config,
    make_runner,
    random_prompts,
    running_engine,
    submit,
    wait_idle,
)

pytestmark = [pytest.mark.anyio, pytest.mark.model]

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
# Six sessions of ~14 blocks against a pool of 32: each turn evicts the oldest sessions.
NUM_SESSIONS = 6
CONFIG = engine_config(num_kv_blocks=32, block_size=4, max_model_len=128)


async def two_turns(engine: LLMEngine, vocab_size: int) -> list[list[int]]:
    """Every session's first turn, then each resumed with its answer and a tool result."""
    prompts = random_prompts([48] * NUM_SESSIONS, vocab_size, seed=1)
    tool_results = random_prompts([6] * NUM_SESSIONS, vocab_size, seed=2)
    outputs: list[list[int]] = []
    for turn in range(2):
        for index, prompt in enumerate(prompts):
            result = await collect(submit(engine, prompt, GREEDY, request_id=f"{turn}-{index}"))
            outputs.append(result.token_ids)
            prompts[index] = prompt + result.token_ids + tool_results[index]
            await wait_idle(engine)
    return outputs


def offload(runner: ModelRunner, host_blocks: int, disk: Path | None = None) -> KVOffload:
    """A tier of ``host_blocks`` in host memory (and 64 on disk under ``disk``)."""
    disk_blocks = 0 if disk is None else 64
    store = HostKVStore(runner.kv_cache, host_blocks, disk)
    return KVOffload(TierIndex(host_blocks, disk_blocks), store)


async def run(
    path: Path, config: EngineConfig, host_blocks: int | None, disk: Path | None = None
) -> tuple[list[list[int]], LLMEngine]:
    """Two turns of every session on a fresh engine (a tier of ``host_blocks``, or none)."""
    runner = make_runner(path, config)
    tier = None if host_blocks is None else offload(runner, host_blocks, disk)
    engine = LLMEngine(runner, Tokenizer(path), config, kv_offload=tier)
    engine.start()
    try:
        outputs = await two_turns(engine, runner.vocab_size)
    finally:
        engine.stop()
    return outputs, engine


async def test_greedy_outputs_are_the_same_with_the_tier_on_and_off(llama_path: Path) -> None:
    without, plain = await run(llama_path, CONFIG, None)
    with_tier, tiered = await run(llama_path, CONFIG, host_blocks=128)
    assert with_tier == without
    assert tiered.kv_offload is not None
    assert tiered.kv_offload.stats.hit_blocks["host"] >= NUM_SESSIONS * 8
    moved = tiered.kv_offload.stats.bytes_moved
    assert moved["device_to_host"] > 0 and moved["host_to_device"] > 0
    # Resumed turns recompute less with the tier than without it.
    assert tiered.stats.num_prefix_cache_hit_tokens > plain.stats.num_prefix_cache_hit_tokens


async def test_the_disk_tier_serves_what_host_memory_evicted(
    llama_path: Path, tmp_path: Path
) -> None:
    without, _ = await run(llama_path, CONFIG, None)
    with_disk, tiered = await run(llama_path, CONFIG, host_blocks=4, disk=tmp_path)
    assert with_disk == without
    assert tiered.kv_offload is not None
    assert tiered.kv_offload.stats.hit_blocks["disk"] > 0
    # The store's own directory went with the engine.
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240


class FailingStore:
    """A host store whose first restore fails."""

    def __init__(self, inner: HostKVStore) -> None:
        self.inner = inner
        self.block_bytes = inner.block_bytes
        self.failed = False

    def apply(self, ops: Sequence[TierOp]) -> TransferBytes:
        if not self.failed and any(isinstance(op, Restore) for op in ops):
            self.failed = True
            raise OSError("copy failed")
        return self.inner.apply(ops)

    def close(self) -> None:
        self.inner.close()


async def test_a_failed_copy_fails_its_step_and_the_tier_starts_over(llama_path: Path) -> None:
    runner = make_runner(llama_path, CONFIG)
    store = FailingStore(HostKVStore(runner.kv_cache, 128))
    tier = KVOffload(TierIndex(128), store)
    prompts = random_prompts([48, 48, 48], runner.vocab_size, seed=3)
    with running_engine(llama_path, CONFIG, runner=runner) as plain:
        expected = [(await collect(submit(plain, p, GREEDY, request_id="e"))).token_ids
                    for p in prompts[:1]]  # fmt: skip
    engine = LLMEngine(runner, Tokenizer(llama_path), CONFIG, kv_offload=tier)
    engine.start()
    try:
        for index, prompt in enumerate(prompts):
            await collect(submit(engine, prompt, GREEDY, request_id=f"w{index}"))
        with pytest.raises(ModelFault):  # its prefix was spilled; restoring it fails
            await collect(submit(engine, prompts[0], GREEDY, request_id="again"))
        # The tier forgot everything, so the next try recomputes and answers right.
        result = await collect(submit(engine, prompts[0], GREEDY, request_id="retry"))
        await wait_idle(engine)
    finally:
        engine.stop()
    assert tier.stats.num_failures == 1
    assert result.token_ids == expected[0]
