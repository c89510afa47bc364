"""The scheduler keeps the running sequences within ``max_loras_per_batch`` adapters."""

from __future__ import annotations

import pytest

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.sequence import Priority, Sequence
from tests.unit.engine.core.test_scheduler import FakeRunner, Harness, reference_tokens


def lora_harness(max_loras: int, *, max_num_seqs: int = 8) -> Harness:
    """A roomy harness that allows ``max_loras`` distinct adapters at once."""
    manager = BlockManager(128, 4)
    config = SchedulerConfig(max_num_seqs, 64, 64, max_loras_per_batch=max_loras)
    return Harness(Scheduler(config, manager), FakeRunner(manager))


def add(harness: Harness, seq_id: str, adapter_id: int, max_tokens: int = 3) -> Sequence:
    """Queue a short request under ``adapter_id`` (0: the base)."""
    seq = Sequence(seq_id, [len(seq_id), 2, 3], arrival=harness.next_arrival, adapter_id=adapter_id)
    harness.next_arrival += 1
    harness.scheduler.add(seq)
    harness.max_tokens[seq_id] = max_tokens
    harness.live[seq_id] = seq
    return seq


def test_no_step_runs_more_adapters_than_the_limit() -> None:
    harness = lora_harness(2)
    for index in range(12):
        add(harness, f"s{index}", adapter_id=index % 4, max_tokens=2 + index % 3)
    while harness.scheduler.has_unfinished:
        output = harness.step()
        adapters = {item.seq.adapter_id for item in output.scheduled} - {0}
        assert len(adapters) <= 2
    assert len(harness.done) == 12
    for seq in harness.done:
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)


def test_a_sequence_whose_adapter_has_no_slot_is_stepped_over() -> None:
    harness = lora_harness(1)
    add(harness, "a", adapter_id=1, max_tokens=5)
    add(harness, "b", adapter_id=2)
    add(harness, "base", adapter_id=0)
    add(harness, "a2", adapter_id=1)
    output = harness.step()
    # "b" waits for adapter 1 to leave; the base and adapter 1 behind it are admitted.
    assert {item.seq.seq_id for item in output.scheduled} == {"a", "base", "a2"}
    harness.drain()
    assert {seq.seq_id for seq in harness.done} == {"a", "b", "base", "a2"}


def test_bad_adapter_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_loras_per_batch"):
        SchedulerConfig(8, 64, 64, max_loras_per_batch=0)
    with pytest.raises(ValueError, match="adapter_id"):
        Sequence("s", [1], adapter_id=-1)


def test_an_online_request_waiting_for_an_adapter_slot_does_not_pause_batch_jobs() -> None:
    """Batch jobs sit out steps only for an online prompt that can run: one whose adapter
    has no slot cannot, so the job's sequence keeps decoding beside it."""
    harness = lora_harness(1)
    job = Sequence("job", [1, 2, 3], Priority.BATCH, arrival=0, adapter_id=1)
    harness.scheduler.add(job)
    harness.max_tokens["job"], harness.live["job"] = 10, job
    harness.next_arrival = 1
    harness.step()  # the job's prefill
    add(harness, "online", adapter_id=2)
    for _ in range(3):
        output = harness.step()
        assert [item.seq.seq_id for item in output.scheduled] == ["job"]
