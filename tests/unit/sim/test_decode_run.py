"""Runs of decode steps timed at once: the same run as one step at a time, fewer events."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.sequence import Sequence
from conveyor.sim.decode_run import silent_steps
from conveyor.sim.run import simulate
from conveyor.sim.scenario import Scenario

KEEP_OUT = ("wall_seconds", "speed_x", "cpu_seconds", "events")


def scenario(fast_forward: bool, faults: list[dict[str, Any]]) -> Scenario:
    """Three H100 workers, few arrivals, long answers: most steps decode alone."""
    return Scenario.model_validate({
        "name": "decode-runs", "duration_s": 6.0, "time_model": {"gpu": "h100"},
        "fleet": {"regions": [{"name": "a", "workers": 3}],
                  "engine": {"max_num_seqs": 32, "kv_tokens": 65536,
                             "fast_forward": fast_forward}},
        "traffic": [{"kind": "poisson", "rate_rps": 6, "prompt_tokens": {"mean": 200},
                     "output_tokens": {"mean": 300}}],
        "faults": faults,
    })  # fmt: skip


FAULTS = [
    [],
    [{"kind": "straggler", "at_s": 1.0, "until_s": 3.0, "worker": "w0"}],
    [{"kind": "kill_worker", "at_s": 4.0, "worker": "w1"}],
]


@pytest.mark.parametrize("faults", FAULTS, ids=["steady", "straggler", "kill"])
def test_a_fast_forwarded_run_equals_the_step_by_step_one(faults: list[dict[str, Any]]) -> None:
    one_by_one = simulate(scenario(False, faults), 2)
    fast = simulate(scenario(True, faults), 2)
    strip = lambda t: {k: v for k, v in t.items() if k not in KEEP_OUT}  # noqa: E731
    assert strip(fast.totals) == strip(one_by_one.totals)
    assert fast.series == one_by_one.series
    assert fast.totals["completed"] > 20
    # The shortcut was taken: a fraction of the events for the same steps.
    assert fast.totals["events"] * 3 < one_by_one.totals["events"]


def _decoding(
    num_blocks: int, prompts: list[int], seats: int = 8
) -> tuple[Scheduler, BlockManager]:
    """A scheduler whose sequences have sampled their first token."""
    manager = BlockManager(num_blocks, 4)
    scheduler = Scheduler(SchedulerConfig(seats, 64, 64), manager)
    for index, length in enumerate(prompts):
        scheduler.add(Sequence(f"s{index}", [index + 1] * length, arrival=index))
    out = scheduler.schedule()
    scheduler.postprocess(out, {item.seq.seq_id: 7 for item in out.scheduled})
    return scheduler, manager


def test_a_run_stops_before_a_sequence_reaches_its_planned_end() -> None:
    scheduler, _ = _decoding(64, [3, 5])
    out = scheduler.schedule()
    # s0 samples 3 more tokens: steps 1 and 2 are silent, step 3 ends it.
    assert silent_steps(out, scheduler, {"s0": 3, "s1": 10}) == 2


def test_a_run_stops_before_the_step_that_would_lack_a_block() -> None:
    # Blocks of 4 tokens: each sequence takes a new block every 4 decode steps, and the
    # 17 blocks left run out before either sequence ends.
    scheduler, manager = _decoding(20, [3, 5])
    out = scheduler.schedule()
    free = manager.num_free_blocks
    steps = silent_steps(out, scheduler, {"s0": 50, "s1": 50})
    assert 2 <= steps < 49
    starts = [item.start_pos for item in out.scheduled]
    tables = [len(item.seq.block_table) for item in out.scheduled]

    def needed(m: int) -> int:
        return sum(max(0, (s + m - 1) // 4 + 1 - t) for s, t in zip(starts, tables, strict=True))

    assert needed(steps) <= free < needed(steps + 1)


def test_no_run_while_a_sequence_waits() -> None:
    scheduler, _ = _decoding(64, [3, 5], seats=2)
    scheduler.add(Sequence("late", [9] * 20, arrival=9))
    out = scheduler.schedule()
    assert scheduler.num_waiting == 1 and len(out.scheduled) == 2  # no seat for it
    assert silent_steps(out, scheduler, {"s0": 50, "s1": 50, "late": 50}) == 0
