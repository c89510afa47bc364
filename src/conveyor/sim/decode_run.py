"""Fast-forward over decode steps that change nothing but token counts.

Between the events that change a generative worker's batch (an arrival, a prefill chunk
ending, a sequence reaching its planned output length, a preemption, a fault), its steps
are the same: every running sequence decodes one token. Such a step changes no decision
of the scheduler: its plan for the next step is the same set of decodes, a step longer.
A run plans step 1 with the real scheduler, works out how many steps (``m``) follow it
unchanged, and times them all at once; the sequences' tokens, computed counts and KV
blocks are advanced in bulk when the run ends (or when something looks at the worker or
changes it in between: then the steps done by that moment are applied, and the step in
flight is planned again by the real scheduler, so the next decision sees the exact state
the step-by-step simulation would). Steps are timed by the same arithmetic, in the same
order, as one at a time, so the clock reads the same floats.

A run is not taken while a sequence waits (an admission may come any step), while the
prefix digest is kept (it is refreshed on its own clock), or while online sequences run
beside a job share (it reads the clock each step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.step_plan import SchedulerOutput
from conveyor.priority import Priority
from conveyor.sim.timemodel import LlmStepTime

# A run shorter than this is stepped one step at a time: nothing to gain.
MIN_RUN_STEPS = 2


@dataclass(slots=True)
class DecodeRun:
    """Steps 1..m of decodes: step 1 planned by the scheduler, ``ends_s[i]`` when step
    ``i + 1`` ends."""

    out: SchedulerOutput
    ends_s: list[float]

    @property
    def num_steps(self) -> int:
        """Steps in the run (``m``)."""
        return len(self.ends_s)


def silent_steps(
    out: SchedulerOutput, scheduler: Scheduler, outputs_left: Mapping[str, int],
    has_job_share: bool = False,
) -> int:  # fmt: skip
    """How many steps, ``out`` first, end with nothing but token counts changed (0 when
    ``out`` is not a step of decodes alone). ``outputs_left`` maps each scheduled
    sequence to the tokens it has still to sample before its planned end;
    ``has_job_share``: the scheduler caps job tokens beside online traffic."""
    if out.preempted or scheduler.num_waiting or len(out.scheduled) != scheduler.num_running:
        return 0
    left = []
    has_online = False
    for item in out.scheduled:
        seq = item.seq
        if item.num_new_tokens != 1 or not item.needs_logits or seq.num_output_tokens < 1:
            return 0
        remaining = outputs_left.get(seq.seq_id)
        if remaining is None:
            return 0
        left.append(remaining)
        has_online = has_online or seq.priority is Priority.ONLINE
    if has_online and has_job_share:
        return 0
    # The step that samples a sequence's last planned token ends the run, not inside it.
    most = min(left) - 1
    return _steps_within_blocks(out, scheduler.block_manager, most)


def _steps_within_blocks(out: SchedulerOutput, manager: BlockManager, most: int) -> int:
    """The largest m <= ``most`` whose steps 2..m need no more blocks than are free (step
    1's blocks are reserved already), so nobody is preempted inside the run."""
    size = manager.block_size
    free = manager.num_free_blocks
    tables = [(item.start_pos, len(item.seq.block_table)) for item in out.scheduled]

    def blocks_for(m: int) -> int:
        # Step i computes position start + i - 1; blocks cover positions < table x size.
        return sum(max(0, (start + m - 1) // size + 1 - table) for start, table in tables)

    if most < 1:
        return 0
    low, high = 1, most
    while low < high:
        mid = (low + high + 1) // 2
        if blocks_for(mid) <= free:
            low = mid
        else:
            high = mid - 1
    return low


def step_ends(
    timing: LlmStepTime, start_s: float, first_step_s: float, slowdown: float,
    num_seqs: int, kv_tokens: int, num_steps: int,
) -> list[float]:  # fmt: skip
    """When each of ``num_steps`` decode steps ends, as the clock would add them up: each
    reads ``num_seqs`` more KV tokens than the one before."""
    now = start_s + first_step_s * slowdown
    ends = [now]
    step_s = timing.step_s
    for index in range(1, num_steps):
        now = now + step_s(num_seqs, num_seqs, kv_tokens + index * num_seqs) * slowdown
        ends.append(now)
    return ends


def advance(
    scheduler: Scheduler, run: DecodeRun, num_steps: int, token: int,
    on_step: Callable[[float], None],
) -> None:  # fmt: skip
    """Apply the run's first ``num_steps`` steps: step 1 through ``postprocess``, the rest
    in bulk (``token`` sampled each time); ``on_step`` is told when each later step
    started (its per-step bookkeeping)."""
    out = run.out
    scheduler.postprocess(out, {item.seq.seq_id: token for item in out.scheduled})
    bulk = num_steps - 1
    if bulk <= 0:
        return
    manager = scheduler.block_manager
    tokens = [token] * bulk
    for item in out.scheduled:
        seq = item.seq
        seq.token_ids.extend(tokens)
        manager.append(seq, bulk)
        seq.num_computed_tokens += bulk
        manager.cache_computed_blocks(seq)
    for index in range(bulk):
        on_step(run.ends_s[index])
