"""The counted engine plans the steps the real scheduler plans, step for step."""

from __future__ import annotations

import random

import pytest

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.sequence import Sequence
from conveyor.sim.counted_cache import FreeBlocks
from conveyor.sim.counted_engine import CountedEngine
from conveyor.sim.counted_pool import CountedSeq
from conveyor.sim.request import SimRequest

BLOCK = 4


def _request(rid: int, prompt: int, output: int) -> SimRequest:
    return SimRequest(rid, "t", "t", [], output, 0.0, 9.0, prompt_len=prompt)


def _real_figures(out: object) -> tuple[int, int, int, int]:
    scheduled = out.scheduled  # type: ignore[attr-defined]
    kv = sum(item.start_pos + item.num_new_tokens for item in scheduled)
    return out.num_batched_tokens, len(scheduled), kv, len(out.preempted)  # type: ignore[attr-defined]


def _run_both(
    seed: int, num_blocks: int, steps: int, check_blocks: bool = True
) -> tuple[list[tuple[int, ...]], ...]:
    """Drive both with the same arrivals; each step's (tokens, sequences, KV tokens read,
    preempted) and, at the end of each step, the requests done."""
    rng = random.Random(seed)
    manager = BlockManager(num_blocks, BLOCK)
    real = Scheduler(SchedulerConfig(8, 48, 200), manager)
    counted = CountedEngine(num_blocks, BLOCK, 8, 48)
    planned: dict[str, int] = {}
    real_steps, counted_steps = [], []
    for index in range(steps):
        if rng.random() < 0.4:
            prompt, output = rng.randint(2, 60), rng.randint(1, 40)
            real.add(Sequence(str(index), [1000 + index] * prompt, arrival=index))
            planned[str(index)] = output
            request = _request(index, prompt, output)
            counted.add(CountedSeq(request, print, index, 0.0, prompt, prompt, output, 9.0))
        if not real.has_unfinished:
            assert not counted.has_work
            continue
        out = real.schedule()
        step = counted.plan()
        tokens, seqs, kv = counted.figures(step)
        real_steps.append(_real_figures(out))
        counted_steps.append((tokens, seqs, kv, step.num_preempted))
        real.postprocess(out, {i.seq.seq_id: 7 for i in out.scheduled if i.needs_logits})
        done_real = []
        for item in out.scheduled:
            seq = item.seq
            if item.needs_logits and seq.num_output_tokens >= planned[seq.seq_id]:
                real.finish(seq.seq_id)
                done_real.append(int(seq.seq_id))
        _, done = counted.end(step)
        real_steps.append(tuple(sorted(done_real)))
        counted_steps.append(tuple(sorted(seq.request.rid for seq in done)))
        if check_blocks:  # as many blocks free, cached or not
            assert counted.free_blocks == manager.num_free_blocks
            assert counted.free.uncached + counted.free.num_cached == counted.free_blocks
    return real_steps, counted_steps


@pytest.mark.parametrize("num_blocks", [400, 60, 52], ids=["roomy", "tight", "exhausted"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_step_is_the_real_schedulers(num_blocks: int, seed: int) -> None:
    real_steps, counted_steps = _run_both(seed, num_blocks, 400)
    assert counted_steps == real_steps
    if num_blocks < 60:  # the pool runs out: preemptions, recomputed prefixes
        assert sum(step[3] for step in real_steps if len(step) == 4) > 0


def test_a_readmitted_sequence_finds_the_head_of_its_tokens_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same run without that cache (all its tokens recomputed) plans other steps.
    real_steps, counted_steps = _run_both(7, 52, 600)
    assert counted_steps == real_steps
    monkeypatch.setattr(FreeBlocks, "cached_for", lambda self, owner: 0)
    monkeypatch.setattr(FreeBlocks, "revive", lambda self, owner: 0)
    _, without_cache = _run_both(7, 52, 600, check_blocks=False)
    assert without_cache != real_steps
