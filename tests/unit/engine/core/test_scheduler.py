"""Tests for the continuous-batching scheduler.

A fake model runner keeps a simulated KV cache keyed by block id: it writes
every scheduled token into its slot and samples from what it reads back
through the block table, so a wrong table, a stale cache hit or a write into a
shared block changes the generated tokens and fails the comparison with a
reference generation.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from conveyor.engine.core.block_manager import BlockManager
from conveyor.engine.core.job_share import JobShare
from conveyor.engine.core.scheduler import Scheduler
from conveyor.engine.core.scheduler_config import SchedulerConfig
from conveyor.engine.core.sequence import Priority, Sequence, SequenceStatus
from conveyor.engine.core.step_plan import ScheduledSeq, SchedulerOutput

VOCAB_SIZE = 50


def next_token(prefix: Iterable[int]) -> int:
    """The fake model: a deterministic function of the whole prefix."""
    state = 0
    for token in prefix:
        state = (state * 31 + token + 1) % 1_000_003
    return state % VOCAB_SIZE + 1


def reference_tokens(prompt: list[int], num_output_tokens: int) -> list[int]:
    """What an unbatched, uncached run of the fake model generates."""
    tokens = list(prompt)
    for _ in range(num_output_tokens):
        tokens.append(next_token(tokens))
    return tokens


class RunnerOutOfMemory(Exception):
    """The fake runner's simulated out-of-memory failure."""


class FakeRunner:
    """Executes scheduler outputs against a simulated paged KV cache."""

    def __init__(self, manager: BlockManager) -> None:
        self.manager = manager
        self.kv: dict[int, list[int | None]] = {}

    def run(self, output: SchedulerOutput, fail: bool = False) -> dict[str, int]:
        """Write every chunk's tokens, then sample where needed (or fail halfway)."""
        chunks = output.to_chunks()
        for chunk in chunks:
            self._write(chunk.token_ids, chunk.start_pos, chunk.block_table)
            if fail:  # a partial write, as a real out-of-memory failure may leave
                raise RunnerOutOfMemory
        sampled: dict[str, int] = {}
        for scheduled, chunk in zip(output.scheduled, chunks, strict=True):
            if chunk.needs_logits:
                prefix = self._read(chunk.end_pos, chunk.block_table)
                assert prefix == scheduled.seq.token_ids[: chunk.end_pos]
                sampled[scheduled.seq.seq_id] = next_token(prefix)
        return sampled

    def _write(self, token_ids: tuple[int, ...], start_pos: int, table: tuple[int, ...]) -> None:
        block_size = self.manager.block_size
        assert len(table) * block_size >= start_pos + len(token_ids)
        for offset, token in enumerate(token_ids):
            position = start_pos + offset
            block_id = table[position // block_size]
            # Writing into a block another sequence shares would corrupt it.
            assert self.manager.block_ref_count(block_id) == 1
            slots = self.kv.setdefault(block_id, [None] * block_size)
            slots[position % block_size] = token

    def _read(self, end_pos: int, table: tuple[int, ...]) -> list[int]:
        block_size = self.manager.block_size
        tokens: list[int] = []
        for position in range(end_pos):
            slots = self.kv.get(table[position // block_size], [None] * block_size)
            token = slots[position % block_size]
            assert token is not None, f"position {position} was never written"
            tokens.append(token)
        return tokens


@dataclass
class Harness:
    """A scheduler, its pool and a fake runner, plus the caller's stop rule."""

    scheduler: Scheduler
    runner: FakeRunner
    max_tokens: dict[str, int] = field(default_factory=dict)
    live: dict[str, Sequence] = field(default_factory=dict)
    done: list[Sequence] = field(default_factory=list)
    next_arrival: int = 0

    @property
    def manager(self) -> BlockManager:
        """The scheduler's block pool."""
        return self.scheduler.block_manager

    def add(
        self,
        seq_id: str,
        prompt: list[int],
        max_tokens: int,
        priority: Priority = Priority.ONLINE,
        arrival: int | None = None,
        group: str | None = None,
    ) -> Sequence:
        """Queue a request; arrivals count up unless given."""
        if arrival is None:
            arrival = self.next_arrival
        self.next_arrival = max(self.next_arrival, arrival) + 1
        seq = Sequence(seq_id, prompt, priority, arrival=arrival, prefix_group=group)
        self.scheduler.add(seq)
        self.max_tokens[seq_id] = max_tokens
        self.live[seq_id] = seq
        return seq

    def step(self) -> SchedulerOutput:
        """One engine iteration: schedule, run, postprocess, apply stop rules."""
        output = self.scheduler.schedule()
        check_invariants(self, output)
        sampled = self.runner.run(output)
        capped = self.scheduler.postprocess(output, sampled)
        self.scheduler.restore_token_budget()
        self.finish_stopped(output, capped)
        return output

    def finish_stopped(self, output: SchedulerOutput, capped: list[Sequence]) -> None:
        """The caller's stop rule: max_tokens reached, or max_model_len reached."""
        for chunk in output.scheduled:
            seq = chunk.seq
            stop = seq.num_output_tokens >= self.max_tokens[seq.seq_id] or seq in capped
            if chunk.needs_logits and stop and seq.status is SequenceStatus.RUNNING:
                self.scheduler.finish(seq.seq_id)
                self.done.append(self.live.pop(seq.seq_id))

    def drain(self, max_steps: int = 1000) -> int:
        """Step until nothing is left; returns the number of steps taken."""
        for num_steps in range(max_steps):
            if not self.scheduler.has_unfinished:
                return num_steps
            self.step()
        raise AssertionError(f"still unfinished after {max_steps} steps")


def make_harness(
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    job_share: JobShare | None = None,
) -> Harness:
    """A harness with small defaults; tests override what they exercise."""
    manager = BlockManager(num_blocks, block_size)
    config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len)
    return Harness(Scheduler(config, manager, job_share), FakeRunner(manager))


def check_invariants(harness: Harness, output: SchedulerOutput) -> None:
    """Per-step limits and exact block accounting."""
    scheduler, manager = harness.scheduler, harness.manager
    config = scheduler.config
    assert len(output.scheduled) <= config.max_num_seqs
    assert output.num_batched_tokens == sum(c.num_new_tokens for c in output.scheduled)
    assert output.num_batched_tokens <= scheduler.token_budget <= config.max_num_batched_tokens
    assert len({c.seq.seq_id for c in output.scheduled}) == len(output.scheduled)
    assert all(c.seq.status is SequenceStatus.RUNNING for c in output.scheduled)
    running = [s for s in harness.live.values() if s.status is SequenceStatus.RUNNING]
    waiting = [s for s in harness.live.values() if s.status is SequenceStatus.WAITING]
    assert (scheduler.num_running, scheduler.num_waiting) == (len(running), len(waiting))
    assert len(running) <= config.max_num_seqs
    assert all(not s.block_table and s.num_computed_tokens == 0 for s in waiting)
    check_block_accounting(manager, running)


def check_block_accounting(manager: BlockManager, holders: list[Sequence]) -> None:
    """Each block's refcount equals the number of tables holding it."""
    counts = [0] * manager.num_blocks
    for seq in holders:
        assert len(set(seq.block_table)) == len(seq.block_table)
        for block_id in seq.block_table:
            counts[block_id] += 1
    assert counts == [manager.block_ref_count(b) for b in range(manager.num_blocks)]
    assert manager.num_free_blocks == counts.count(0)
    assert 0 <= manager.num_used_blocks <= manager.num_blocks


def assert_pool_whole(manager: BlockManager) -> None:
    """Every block is free and no reference is left."""
    assert manager.num_free_blocks == manager.num_blocks
    check_block_accounting(manager, [])


def chunk_sizes(output: SchedulerOutput) -> dict[str, int]:
    """seq_id -> tokens scheduled, in step order."""
    return {c.seq.seq_id: c.num_new_tokens for c in output.scheduled}


# -- configuration and admission checks ------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 8, 8), "max_num_seqs must be an int >= 1"),
        ((1, 0, 8), "max_num_batched_tokens must be an int >= 1"),
        ((1, 8, 0), "max_model_len must be an int >= 1"),
        ((1, 8, 2.5), "max_model_len must be an int"),
        ((True, 8, 8), "max_num_seqs must be an int"),
        ((4, 2, 8), r"max_num_batched_tokens \(2\) must be >= max_num_seqs \(4\)"),
    ],
)
def test_bad_config_is_refused(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(*args)


def test_pool_must_hold_a_sequence_of_max_model_len() -> None:
    config = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=8, max_model_len=17)
    with pytest.raises(ValueError, match="needs 5 blocks of 4 tokens but the pool has 4"):
        Scheduler(config, BlockManager(4, 4))
    Scheduler(SchedulerConfig(1, 8, 16), BlockManager(4, 4))


def test_add_refuses_bad_sequences() -> None:
    harness = make_harness(max_model_len=8)
    scheduler = harness.scheduler
    with pytest.raises(ValueError, match="9 tokens, more than max_model_len 8"):
        scheduler.add(Sequence("long", list(range(9))))
    scheduler.add(Sequence("a", [1]))
    with pytest.raises(ValueError, match="already queued"):
        scheduler.add(Sequence("a", [2]))
    used = Sequence("b", [1, 2])
    used.num_computed_tokens = 1
    with pytest.raises(ValueError, match="not fresh"):
        scheduler.add(used)
    gone = Sequence("c", [1])
    gone.status = SequenceStatus.FINISHED
    with pytest.raises(ValueError, match="not fresh"):
        scheduler.add(gone)
    assert scheduler.num_waiting == 1
    scheduler.add(Sequence("exact", list(range(8))))  # == max_model_len is fine


# -- basic stepping ---------------------------------------------------------------


def test_empty_scheduler_gives_an_empty_step() -> None:
    harness = make_harness()
    output = harness.scheduler.schedule()
    assert output.is_empty
    assert output.num_batched_tokens == 0
    assert output.to_chunks() == []
    assert not harness.scheduler.has_unfinished
    assert harness.scheduler.postprocess(output, {}) == []


def test_prefill_then_decode() -> None:
    harness = make_harness()
    seq = harness.add("a", [3, 1, 4, 1, 5], max_tokens=3)
    output = harness.scheduler.schedule()
    (chunk,) = output.to_chunks()
    assert chunk.token_ids == (3, 1, 4, 1, 5)
    assert (chunk.start_pos, chunk.needs_logits) == (0, True)
    assert chunk.block_table == tuple(seq.block_table)
    assert len(seq.block_table) == 2
    assert seq.num_computed_tokens == 0  # schedule() does not advance
    assert seq.is_prefill
    harness.scheduler.postprocess(output, harness.runner.run(output))
    assert seq.num_computed_tokens == 5
    assert not seq.is_prefill
    decode = harness.scheduler.schedule()
    (chunk,) = decode.to_chunks()
    assert (chunk.token_ids, chunk.start_pos) == ((seq.token_ids[5],), 5)
    harness.scheduler.postprocess(decode, harness.runner.run(decode))
    assert harness.drain() == 1
    assert seq.status is SequenceStatus.FINISHED
    assert seq.token_ids == reference_tokens([3, 1, 4, 1, 5], 3)
    assert_pool_whole(harness.manager)


def test_chunked_prefill_splits_a_long_prompt() -> None:
    harness = make_harness(max_num_batched_tokens=8, max_model_len=32)
    prompt = list(range(1, 21))
    seq = harness.add("a", prompt, max_tokens=2)
    sizes, starts, logits, blocks = [], [], [], []
    for _ in range(3):
        output = harness.step()
        (chunk,) = output.scheduled
        sizes.append(chunk.num_new_tokens)
        starts.append(chunk.start_pos)
        logits.append(chunk.needs_logits)
        blocks.append(len(seq.block_table))
    assert sizes == [8, 8, 4]
    assert starts == [0, 8, 16]
    assert logits == [False, False, True]
    # Blocks arrive with the chunks, not all at once.
    assert blocks == [2, 4, 5]
    assert seq.num_output_tokens == 1
    harness.drain()
    assert seq.token_ids == reference_tokens(prompt, 2)


def test_mixed_step_has_decodes_and_a_prefill_chunk() -> None:
    harness = make_harness(max_num_batched_tokens=8, max_model_len=64)
    first = harness.add("a", [1, 2, 3], max_tokens=10)
    harness.step()
    second = harness.add("b", list(range(30)), max_tokens=1)
    output = harness.step()
    assert chunk_sizes(output) == {"a": 1, "b": 7}
    assert [c.seq for c in output.scheduled] == [first, second]
    assert second.is_prefill


def test_decodes_are_served_before_running_prefills() -> None:
    harness = make_harness(max_num_seqs=2, max_num_batched_tokens=4, max_model_len=64)
    young = harness.add("young", [1], max_tokens=20, arrival=5)
    harness.step()
    # Older, so ordered first: in one ordered pass its prefill would eat the budget.
    old = harness.add("old", list(range(40)), max_tokens=1, arrival=0)
    assert chunk_sizes(harness.step()) == {"young": 1, "old": 3}
    for _ in range(5):
        output = harness.step()
        assert chunk_sizes(output) == {"young": 1, "old": 3}
        assert output.scheduled[0].seq is young
    assert old.is_prefill and not young.is_prefill


def test_max_num_seqs_caps_running_sequences() -> None:
    harness = make_harness(max_num_seqs=2)
    for index in range(5):
        harness.add(f"s{index}", [index + 1, 2, 3], max_tokens=4)
    output = harness.step()
    assert set(chunk_sizes(output)) == {"s0", "s1"}
    assert harness.scheduler.num_running == 2
    assert harness.scheduler.num_waiting == 3
    harness.drain()
    assert [seq.seq_id for seq in harness.done][:2] == ["s0", "s1"]


def test_online_is_admitted_before_batch() -> None:
    harness = make_harness(max_num_seqs=1)
    harness.add("batch", [1, 2], max_tokens=2, priority=Priority.BATCH)
    harness.add("online", [3, 4], max_tokens=2, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"online": 2}
    harness.drain()
    assert [seq.seq_id for seq in harness.done] == ["online", "batch"]


def test_an_online_request_takes_a_seat_from_the_newest_batch_job_sequence() -> None:
    harness = make_harness(max_num_seqs=2)
    old = harness.add("batch-old", [1, 2], max_tokens=6, priority=Priority.BATCH)
    new = harness.add("batch-new", [3, 4], max_tokens=6, priority=Priority.BATCH)
    harness.step()
    online = harness.add("online", [5, 6], max_tokens=2, priority=Priority.ONLINE)
    output = harness.step()
    assert output.preempted == [new]
    assert chunk_sizes(output) == {"online": 2}  # the job sits out the online prefill step
    assert new.status is SequenceStatus.WAITING
    harness.drain()  # the preempted job still finishes, with the same tokens
    for seq in (old, new, online):
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)
    assert_pool_whole(harness.manager)


def test_an_online_request_takes_blocks_that_batch_job_sequences_hold() -> None:
    # 2 blocks of 4 tokens, one held by each batch-job sequence; their decodes still fit.
    harness = make_harness(
        num_blocks=2, block_size=4, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=8
    )
    jobs = [harness.add(f"job{i}", [i + 1, 2, 3], max_tokens=2, priority=Priority.BATCH)
            for i in range(2)]  # fmt: skip
    harness.step()
    assert harness.manager.num_free_blocks == 0
    online = harness.add("online", [9, 9, 9], max_tokens=1, priority=Priority.ONLINE)
    output = harness.step()  # the online prompt runs (and, one token long, finishes)
    assert output.preempted == [jobs[1]]
    assert chunk_sizes(output) == {"online": 3}
    harness.drain()
    for seq in (*jobs, online):
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)
    assert_pool_whole(harness.manager)


def test_an_online_prompt_that_needs_every_block_a_job_holds_plus_the_free_ones_gets_in() -> None:
    # 2 blocks of 4 tokens: the job holds one, one is free; the 7-token prompt needs both.
    harness = make_harness(
        num_blocks=2, block_size=4, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=8
    )
    job = harness.add("job", [1, 2, 3], max_tokens=2, priority=Priority.BATCH)
    harness.step()
    assert harness.manager.num_free_blocks == 1
    online = harness.add("online", [9] * 7, max_tokens=1, priority=Priority.ONLINE)
    output = harness.step()
    assert output.preempted == [job]
    assert chunk_sizes(output) == {"online": 7}
    harness.drain()
    for seq in (job, online):
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)


def test_a_job_sequence_preempted_twice_counts_both_preemptions() -> None:
    harness = make_harness(max_num_seqs=1)
    job = harness.add("job", [1, 2], max_tokens=8, priority=Priority.BATCH)
    for index in range(2):
        harness.step()
        harness.add(f"online{index}", [3, 4], max_tokens=1, priority=Priority.ONLINE)
        assert harness.step().preempted == [job]
    assert job.num_preemptions == 2
    harness.drain()
    assert job.token_ids == reference_tokens([1, 2], 8)


def test_an_online_request_never_evicts_another_online_request() -> None:
    harness = make_harness(max_num_seqs=1)
    first = harness.add("first", [1, 2], max_tokens=3, priority=Priority.ONLINE)
    harness.step()
    harness.add("second", [3, 4], max_tokens=1, priority=Priority.ONLINE)
    output = harness.step()
    assert output.preempted == []
    assert chunk_sizes(output) == {"first": 1}
    assert first.num_preemptions == 0


def test_a_batch_job_sequence_never_evicts_anyone_to_get_in() -> None:
    harness = make_harness(max_num_seqs=1)
    harness.add("job-old", [1, 2], max_tokens=3, priority=Priority.BATCH)
    harness.step()
    harness.add("job-new", [3, 4], max_tokens=1, priority=Priority.BATCH)
    assert harness.step().preempted == []


def test_nothing_is_preempted_when_it_would_not_make_room() -> None:
    # The online prompt needs 4 blocks; an online sequence holds 2 of the 4.
    harness = make_harness(
        num_blocks=4, block_size=2, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=8
    )
    harness.add("online-old", [1, 2, 3], max_tokens=4, priority=Priority.ONLINE)
    harness.add("job", [4, 5, 6], max_tokens=4, priority=Priority.BATCH)
    harness.step()
    harness.add("online-big", [7] * 7, max_tokens=1, priority=Priority.ONLINE)
    output = harness.step()
    assert output.preempted == []
    assert "job" in chunk_sizes(output)


def test_an_online_prompt_takes_the_token_budget_before_a_batch_prefill() -> None:
    harness = make_harness(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64)
    job = harness.add("job", list(range(1, 41)), max_tokens=1, priority=Priority.BATCH)
    assert chunk_sizes(harness.step()) == {"job": 8}  # a long batch prefill, chunked
    harness.add("online", [9, 8, 7, 6, 5, 4], max_tokens=1, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"online": 6}  # the job sits this step out
    assert chunk_sizes(harness.step()) == {"job": 8}
    assert job.is_prefill


def long_prompt_harness(max_num_seqs: int = 8) -> Harness:
    """A pool for 32k-token prompts with a 2,048-token step budget (the default)."""
    return make_harness(
        num_blocks=2100, block_size=16, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048, max_model_len=32768,
    )  # fmt: skip


def test_a_short_request_starts_at_once_while_a_long_prompt_prefills() -> None:
    """A 2-token request behind a 30k-token prefill is computed the next step, and the
    prefill keeps the rest of that step's budget."""
    harness = long_prompt_harness()
    rng = random.Random(4)
    long = harness.add("long", [rng.randint(1, VOCAB_SIZE) for _ in range(30_000)], 1)
    assert chunk_sizes(harness.step()) == {"long": 2048}
    harness.add("short", [1, 2], max_tokens=1)
    output = harness.step()
    assert chunk_sizes(output) == {"long": 2046, "short": 2}
    assert output.scheduled[0].seq is long  # topped up in its place in the step
    assert [seq.seq_id for seq in harness.done] == ["short"]
    assert long.is_prefill
    harness.drain()
    assert long.token_ids == reference_tokens(long.prompt_token_ids, 1)


def test_requests_in_a_row_behind_a_long_prefill_each_start_at_once() -> None:
    """Behind a long prefill, short requests arriving one after another never wait for it."""
    harness = long_prompt_harness()
    harness.add("long", [5] * 30_000, max_tokens=1)
    harness.step()
    for index in range(3):
        harness.add(f"short-{index}", [index + 1, 2, 3], max_tokens=1)
        assert chunk_sizes(harness.step()) == {"long": 2045, f"short-{index}": 3}


def test_a_long_arrival_gets_half_the_step_beside_a_long_prefill() -> None:
    """A waiting prompt longer than what is left is admitted with the half of the step that
    a running prefill leaves while someone waits; a short one behind both starts the step
    after it arrives."""
    harness = long_prompt_harness()
    harness.add("first", [5] * 30_000, max_tokens=1)
    harness.step()
    harness.add("second", [6] * 30_000, max_tokens=1)
    assert chunk_sizes(harness.step()) == {"first": 1024, "second": 1024}
    assert chunk_sizes(harness.step()) == {"first": 2048}  # nobody waits: oldest first
    harness.add("short", [1, 2], max_tokens=1)
    assert chunk_sizes(harness.step()) == {"first": 2046, "short": 2}


def test_a_waiting_request_that_cannot_get_in_costs_the_prefill_nothing() -> None:
    """Tokens held back for a waiting request that has no seat go back to the prefill."""
    harness = long_prompt_harness(max_num_seqs=1)
    harness.add("long", [5] * 30_000, max_tokens=1)
    harness.step()
    harness.add("short", [1, 2], max_tokens=1)
    assert chunk_sizes(harness.step()) == {"long": 2048}


def test_a_short_request_behind_long_arrivals_starts_the_step_it_arrives() -> None:
    """Long prompts queued ahead of a short one do not hold it back: each admitted prompt
    leaves half of what is left to those waiting behind it, and the step stays full."""
    harness = long_prompt_harness()
    harness.add("running", [4] * 30_000, max_tokens=1)
    harness.step()
    for index in range(3):
        harness.add(f"long-{index}", [5 + index] * 30_000, max_tokens=1)
    harness.add("short", [1, 2], max_tokens=1)
    sizes = chunk_sizes(harness.step())
    assert sizes == {"running": 1024 + 126, "long-0": 512, "long-1": 256, "long-2": 128,
                     "short": 2}  # fmt: skip
    assert [seq.seq_id for seq in harness.done] == ["short"]


def test_a_burst_of_equal_prompts_fills_the_step_with_whole_ones_and_one_piece() -> None:
    """Each prompt of a burst leaves half the room behind it until that half is a sliver
    of the step: the last one admitted then takes the rest, so the step holds whole
    prompts and one piece, not a trail of halves (56, 28, 14, ... tokens) each attended
    apart in the step after."""
    harness = long_prompt_harness(max_num_seqs=64)
    for index in range(40):
        harness.add(f"p{index:02}", [index + 1] * 129, max_tokens=1)
    whole = {f"p{index:02}": 129 for index in range(15)}
    assert chunk_sizes(harness.step()) == {**whole, "p15": 113}  # 2,048 = 15 x 129 + 113
    whole = {f"p{index:02}": 129 for index in range(16, 31)}
    assert chunk_sizes(harness.step()) == {"p15": 16, **whole, "p31": 97}


def test_prompts_admitted_together_take_back_what_the_queue_did_not_use() -> None:
    """A long prompt admitted with half the step, beside one that then finds no seat, gets
    the rest of the step: nothing held back for the queue is lost."""
    harness = long_prompt_harness(max_num_seqs=1)
    harness.add("long", [5] * 30_000, max_tokens=1)
    harness.add("short", [1, 2], max_tokens=1)
    assert chunk_sizes(harness.step()) == {"long": 2048}


def test_with_nobody_waiting_a_prefill_short_of_blocks_is_preempted_at_once() -> None:
    """Room is held back from running prefills only while someone waits: otherwise the
    newer of two prefills that finds no free block is preempted in that step, giving its
    blocks back, as any running sequence short of blocks is."""
    harness = make_harness(num_blocks=9, max_num_batched_tokens=16, max_model_len=32)
    harness.add("job-a", list(range(1, 26)), max_tokens=4, priority=Priority.BATCH)
    harness.add("online", list(range(30, 39)), max_tokens=1)
    assert chunk_sizes(harness.step()) == {"online": 9, "job-a": 7}
    harness.add("job-b", list(range(50, 78)), max_tokens=4, priority=Priority.BATCH)
    assert chunk_sizes(harness.step()) == {"job-a": 8, "job-b": 8}
    assert harness.manager.num_free_blocks == 3  # job-a's last 10 tokens take all three
    output = harness.step()
    assert chunk_sizes(output) == {"job-a": 10}
    assert [seq.seq_id for seq in output.preempted] == ["job-b"]


def test_an_online_prompt_fits_by_what_its_cached_prefix_leaves_to_compute() -> None:
    """Whether a waiting online prompt can start (and batch jobs sit the step out for it)
    counts only the tokens its cached prefix does not hold: here 2 tokens, one free block,
    though its 14 tokens would not fit the two free blocks."""
    harness = make_harness(num_blocks=7, max_num_batched_tokens=16, max_model_len=24)
    prefix = list(range(20, 32))  # three full blocks
    harness.add("job", [1, 2], max_tokens=20, priority=Priority.BATCH)
    harness.add("holder", [*prefix, 7], max_tokens=20)  # keeps the prefix's blocks in use
    assert chunk_sizes(harness.step()) == {"holder": 13, "job": 2}
    assert harness.manager.num_free_blocks == 2
    harness.add("reuser", [*prefix, 8, 9], max_tokens=1)
    assert chunk_sizes(harness.step()) == {"holder": 1, "reuser": 2}  # the job sat out


def test_batch_jobs_sit_out_an_online_prefills_last_two_tokens_too() -> None:
    harness = make_harness(max_num_batched_tokens=8)
    harness.add("job", [1, 2], max_tokens=20, priority=Priority.BATCH)
    harness.step()
    harness.add("online", list(range(1, 11)), max_tokens=1)
    assert chunk_sizes(harness.step()) == {"online": 8}
    assert chunk_sizes(harness.step()) == {"online": 2}  # still a prefill: the job waits
    assert chunk_sizes(harness.step()) == {"job": 1}


def test_batch_jobs_sit_out_online_prefills_for_a_bounded_number_of_steps() -> None:
    from conveyor.engine.core.scheduler import MAX_BATCH_PAUSE_STEPS

    harness = make_harness(max_num_seqs=4, max_num_batched_tokens=4, max_model_len=64)
    harness.add("job", [1, 2], max_tokens=40, priority=Priority.BATCH)
    harness.step()
    # A long online prompt takes many 4-token prefill chunks.
    harness.add("online", list(range(1, 49)), max_tokens=1, priority=Priority.ONLINE)
    sizes = [chunk_sizes(harness.step()) for _ in range(MAX_BATCH_PAUSE_STEPS + 1)]
    assert all(step == {"online": 4} for step in sizes[:MAX_BATCH_PAUSE_STEPS])
    assert "job" in sizes[MAX_BATCH_PAUSE_STEPS]  # the job is never starved


def test_waiting_order_is_priority_then_arrival() -> None:
    harness = make_harness(max_num_seqs=1)
    for seq_id, priority in [("b0", 1), ("o1", 0), ("b2", 1), ("o3", 0)]:
        harness.add(seq_id, [1], max_tokens=1, priority=Priority(priority))
    harness.drain()
    assert [seq.seq_id for seq in harness.done] == ["o1", "o3", "b0", "b2"]


def test_the_online_waiting_are_counted_and_listed_apart_from_batch_lines() -> None:
    harness = make_harness(max_num_seqs=1)
    for seq_id, priority in [("b0", 1), ("o1", 0), ("b2", 1), ("o3", 0), ("o4", 0)]:
        harness.add(seq_id, [1], max_tokens=2, priority=Priority(priority))
    scheduler = harness.scheduler
    assert scheduler.num_waiting_online == 3
    assert [seq.seq_id for seq in scheduler.waiting_online()] == ["o1", "o3", "o4"]
    harness.step()  # o1 takes the one seat
    assert [seq.seq_id for seq in scheduler.waiting_online()] == ["o3", "o4"]
    harness.drain()
    assert scheduler.num_waiting_online == 0 and scheduler.waiting_online() == []


def test_batch_lines_waiting_or_running_are_counted_apart() -> None:
    harness = make_harness(max_num_seqs=2)
    scheduler = harness.scheduler
    harness.add("b0", [1], max_tokens=3, priority=Priority.BATCH)
    harness.add("o1", [1], max_tokens=3, priority=Priority.ONLINE)
    harness.add("b2", [1], max_tokens=3, priority=Priority.BATCH)
    assert scheduler.num_batch == 2  # waiting
    harness.step()  # o1 and b0 take the two seats, b2 waits
    assert (scheduler.num_running, scheduler.num_waiting, scheduler.num_batch) == (2, 1, 2)
    harness.drain()
    assert scheduler.num_batch == 0


# -- prefix caching ---------------------------------------------------------------


def test_same_prompt_shares_blocks_and_computes_only_uncached_tokens() -> None:
    harness = make_harness(block_size=4)
    prompt = list(range(1, 14))  # three full blocks and one more token
    first = harness.add("a", prompt, max_tokens=5)
    harness.step()
    second = harness.add("b", prompt, max_tokens=5)
    output = harness.step()
    assert chunk_sizes(output) == {"a": 1, "b": 1}
    assert second.num_cached_tokens == 12
    assert second.block_table[:3] == first.block_table[:3]
    assert [harness.manager.block_ref_count(b) for b in first.block_table[:3]] == [2, 2, 2]
    harness.drain()
    assert first.token_ids == second.token_ids == reference_tokens(prompt, 5)
    assert_pool_whole(harness.manager)


def test_n_siblings_allocate_the_prompts_blocks_once() -> None:
    harness = make_harness(block_size=4)
    prompt = list(range(1, 14))  # three full blocks and one more token
    siblings = [harness.add(name, prompt, max_tokens=4, group="g") for name in "abc"]
    assert chunk_sizes(harness.step()) == {"a": 13}  # b and c wait for a's prompt
    assert chunk_sizes(harness.step()) == {"a": 1, "b": 1, "c": 1}
    shared = siblings[0].block_table[:3]
    assert all(seq.block_table[:3] == shared for seq in siblings)
    assert [harness.manager.block_ref_count(b) for b in shared] == [3, 3, 3]
    assert [seq.num_cached_tokens for seq in siblings] == [0, 12, 12]
    # The prompt's three blocks once, plus one private block per sibling.
    assert len({b for seq in siblings for b in seq.block_table}) == 3 + 3
    harness.drain()
    assert all(seq.token_ids == reference_tokens(prompt, 4) for seq in siblings)
    assert_pool_whole(harness.manager)


def test_siblings_wait_through_a_chunked_prefill_and_not_for_a_gone_sibling() -> None:
    harness = make_harness(block_size=4, max_num_batched_tokens=8)
    prompt = list(range(1, 14))
    harness.add("a", prompt, max_tokens=2, group="g")
    late = harness.add("b", prompt, max_tokens=2, group="g")
    assert chunk_sizes(harness.step()) == {"a": 8}
    assert chunk_sizes(harness.step()) == {"a": 5}
    assert chunk_sizes(harness.step()) == {"a": 1, "b": 1}
    assert late.num_cached_tokens == 12
    harness.add("c", prompt + [9] * 4, max_tokens=2, group="h")
    harness.add("d", prompt + [9] * 4, max_tokens=2, group="h")
    output = harness.step()
    assert "c" in chunk_sizes(output) and "d" not in chunk_sizes(output)
    assert harness.scheduler.abort("c") is not None
    harness.live.pop("c")
    assert "d" in chunk_sizes(harness.step())  # its sibling is gone: it computes the prompt
    harness.drain()
    assert_pool_whole(harness.manager)


def test_a_short_prompt_has_no_block_to_share_so_siblings_do_not_wait() -> None:
    harness = make_harness(block_size=4)
    harness.add("a", [1, 2, 3, 4], max_tokens=2, group="g")
    harness.add("b", [1, 2, 3, 4], max_tokens=2, group="g")
    assert chunk_sizes(harness.step()) == {"a": 4, "b": 4}


def test_prompt_on_a_block_boundary_recomputes_its_last_block() -> None:
    harness = make_harness(block_size=4)
    prompt = list(range(1, 13))  # exactly three blocks
    first = harness.add("a", prompt, max_tokens=3)
    harness.step()
    second = harness.add("b", prompt, max_tokens=3)
    output = harness.step()
    (chunk,) = [c for c in output.scheduled if c.seq is second]
    assert (chunk.start_pos, chunk.num_new_tokens, chunk.needs_logits) == (8, 4, True)
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]
    harness.drain()
    assert second.token_ids == reference_tokens(prompt, 3)


def test_cached_prefix_survives_the_sequence_that_computed_it() -> None:
    harness = make_harness(block_size=4)
    prompt = list(range(1, 10))
    harness.add("a", prompt, max_tokens=1)
    harness.drain()
    assert_pool_whole(harness.manager)
    later = harness.add("b", prompt, max_tokens=2)
    output = harness.step()
    assert (output.scheduled[0].start_pos, output.scheduled[0].num_new_tokens) == (8, 1)
    assert later.num_cached_tokens == 8
    harness.drain()
    assert later.token_ids == reference_tokens(prompt, 2)


# -- preemption -------------------------------------------------------------------


def test_preemption_picks_the_least_important_newest_and_requeues_it_in_place() -> None:
    # 6 blocks of 2 tokens; every sequence eventually wants 4+ blocks.
    harness = make_harness(
        num_blocks=6, block_size=2, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=12
    )
    online = harness.add("online", [1, 2, 3], max_tokens=8)
    batch_old = harness.add("batch-old", [4, 5, 6], max_tokens=8, priority=Priority.BATCH)
    batch_new = harness.add("batch-new", [7, 8, 9], max_tokens=8, priority=Priority.BATCH)
    victims: list[str] = []
    while not victims:
        victims = [seq.seq_id for seq in harness.step().preempted]
    assert victims == ["batch-new"]
    assert batch_new.status is SequenceStatus.WAITING
    assert batch_new.num_preemptions == 1
    assert batch_new.num_computed_tokens == 0
    assert batch_new.num_output_tokens > 0  # generated tokens are kept, to be recomputed
    later = harness.add("later", [1, 1, 1], max_tokens=1, priority=Priority.BATCH)
    admitted: list[str] = []
    while harness.scheduler.has_unfinished:
        for chunk in harness.step().scheduled:
            if chunk.seq in (batch_new, later) and chunk.seq.seq_id not in admitted:
                admitted.append(chunk.seq.seq_id)
    assert admitted == ["batch-new", "later"]
    for seq in (online, batch_old, batch_new, later):
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)
    assert_pool_whole(harness.manager)


def test_a_step_that_preempts_admits_no_one() -> None:
    harness = make_harness(
        num_blocks=4, block_size=2, max_num_seqs=3, max_num_batched_tokens=8, max_model_len=8
    )
    first = harness.add("a", [1, 2, 3], max_tokens=4)
    second = harness.add("b", [4, 5, 6], max_tokens=4)
    assert chunk_sizes(harness.step()) == {"a": 3, "b": 3}
    assert chunk_sizes(harness.step()) == {"a": 1, "b": 1}  # pool now full
    urgent = harness.add("urgent", [9], max_tokens=1, priority=Priority.ONLINE, arrival=0)
    output = harness.step()  # a needs a block: b is preempted, one block stays free
    assert output.preempted == [second]
    assert chunk_sizes(output) == {"a": 1}
    assert harness.manager.num_free_blocks == 1
    assert urgent.status is SequenceStatus.WAITING  # it would fit, but the pool is short
    assert chunk_sizes(harness.step()) == {"a": 1, "urgent": 1}
    harness.drain()
    for seq in (first, second, urgent):
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)


def test_preempted_sequences_finish_with_the_same_tokens() -> None:
    rng = random.Random(7)
    jobs = [
        (
            f"s{i}",
            [rng.randint(1, VOCAB_SIZE) for _ in range(rng.randint(1, 10))],
            rng.randint(1, 14),
        )
        for i in range(12)
    ]
    results: dict[str, dict[str, list[int]]] = {}
    preemptions: dict[str, int] = {}
    for name, num_blocks in (("roomy", 200), ("tight", 12)):
        harness = make_harness(
            num_blocks=num_blocks,
            block_size=2,
            max_num_seqs=6,
            max_num_batched_tokens=12,
            max_model_len=24,
        )
        for seq_id, prompt, max_tokens in jobs:
            harness.add(seq_id, prompt, max_tokens)
        harness.drain()
        results[name] = {seq.seq_id: seq.token_ids for seq in harness.done}
        preemptions[name] = sum(seq.num_preemptions for seq in harness.done)
        assert_pool_whole(harness.manager)
    assert preemptions["roomy"] == 0
    assert preemptions["tight"] > 0
    assert results["tight"] == results["roomy"]
    for seq_id, prompt, max_tokens in jobs:
        assert results["tight"][seq_id] == reference_tokens(prompt, max_tokens)


def test_a_victim_already_scheduled_this_step_is_unscheduled() -> None:
    # "young" decodes first (single-token pass); then the older prefill "old"
    # finds no free block, and the victim is young, whose chunk leaves the step.
    harness = make_harness(
        num_blocks=4, block_size=2, max_num_seqs=2, max_num_batched_tokens=2, max_model_len=8
    )
    young = harness.add("young", [5, 6, 7], max_tokens=5, arrival=1)
    assert chunk_sizes(harness.step()) == {"young": 2}
    assert chunk_sizes(harness.step()) == {"young": 1}
    old = harness.add("old", list(range(1, 9)), max_tokens=1, arrival=0)
    assert chunk_sizes(harness.step()) == {"young": 1, "old": 1}
    assert chunk_sizes(harness.step()) == {"young": 1, "old": 1}
    assert harness.manager.num_free_blocks == 0
    output = harness.step()
    assert output.preempted == [young]
    assert chunk_sizes(output) == {"old": 2}  # young's refunded token went to old
    assert output.num_batched_tokens == 2
    harness.drain()
    for seq in (young, old):
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)
    assert (young.num_output_tokens, old.num_output_tokens) == (5, 1)
    assert_pool_whole(harness.manager)


# -- aborts, finishing and the two-phase step -------------------------------------


def test_abort_from_either_queue_frees_blocks() -> None:
    harness = make_harness(max_num_seqs=1)
    running = harness.add("run", [1, 2, 3], max_tokens=5)
    waiting = harness.add("wait", [4, 5], max_tokens=5)
    harness.step()
    assert harness.manager.num_used_blocks == 1
    assert harness.scheduler.abort("run") is running
    assert running.status is SequenceStatus.ABORTED
    assert running.block_table == []
    assert_pool_whole(harness.manager)
    assert harness.scheduler.abort("wait") is waiting
    assert waiting.status is SequenceStatus.ABORTED
    assert harness.scheduler.abort("wait") is None
    assert harness.scheduler.abort("nobody") is None
    assert not harness.scheduler.has_unfinished


def test_abort_between_schedule_and_postprocess_drops_the_chunk() -> None:
    harness = make_harness()
    gone = harness.add("gone", [1, 2, 3], max_tokens=5)
    kept = harness.add("kept", [4, 5, 6], max_tokens=5)
    output = harness.scheduler.schedule()
    sampled = harness.runner.run(output)
    harness.scheduler.abort("gone")
    # A namesake added meanwhile must not receive the old chunk either.
    namesake = Sequence("gone", [9], arrival=99)
    harness.scheduler.add(namesake)
    harness.scheduler.postprocess(output, sampled)
    assert gone.num_output_tokens == 0 and gone.num_computed_tokens == 0
    assert namesake.num_computed_tokens == 0 and namesake.num_output_tokens == 0
    assert kept.num_output_tokens == 1


def test_finish_frees_and_rejects_unknown_ids() -> None:
    harness = make_harness(max_num_seqs=1)
    first = harness.add("a", [1, 2], max_tokens=9)
    second = harness.add("b", [3, 4], max_tokens=9)
    harness.step()
    assert harness.scheduler.get("a") is first
    assert harness.scheduler.finish("a") is first
    assert harness.scheduler.get("a") is None
    assert harness.scheduler.finish("b") is second  # straight from the waiting queue
    assert second.status is SequenceStatus.FINISHED
    with pytest.raises(ValueError, match="no waiting or running sequence"):
        harness.scheduler.finish("a")
    assert_pool_whole(harness.manager)


def test_postprocess_validates_before_changing_anything() -> None:
    harness = make_harness(max_num_batched_tokens=8)
    long = harness.add("long", list(range(20)), max_tokens=2)
    output = harness.scheduler.schedule()
    short = harness.add("short", [1, 2], max_tokens=2)  # arrives after the first plan
    assert chunk_sizes(output) == {"long": 8}
    with pytest.raises(ValueError, match="did not sample"):
        harness.scheduler.postprocess(output, {"long": 3})
    with pytest.raises(ValueError, match="did not sample"):
        harness.scheduler.postprocess(output, {"short": 3})
    assert long.num_computed_tokens == 0
    harness.scheduler.postprocess(output, {})
    output = harness.scheduler.schedule()
    assert chunk_sizes(output) == {"long": 6, "short": 2}  # the waiting one starts beside it
    harness.scheduler.postprocess(output, {"short": 5})
    output = harness.scheduler.schedule()
    assert chunk_sizes(output) == {"short": 1, "long": 6}
    with pytest.raises(ValueError, match="no sampled token"):
        harness.scheduler.postprocess(output, {"long": 3})
    with pytest.raises(ValueError, match="'short': token id -1 is out of range"):
        harness.scheduler.postprocess(output, {"long": 3, "short": -1})
    assert (long.num_computed_tokens, short.num_computed_tokens) == (14, 2)
    harness.scheduler.postprocess(output, {"long": 3, "short": 4})
    with pytest.raises(ValueError, match="latest schedule"):
        harness.scheduler.postprocess(output, {"long": 3, "short": 4})
    assert (long.token_ids[-1], short.token_ids[-1]) == (3, 4)


def test_an_unsampled_prompt_ends_with_its_blocks_cached_and_no_token() -> None:
    harness = make_harness()
    prompt = list(range(1, 10))
    scored = harness.add("scored", prompt, max_tokens=0)
    output = harness.scheduler.schedule()
    with pytest.raises(ValueError, match="did not sample"):
        harness.scheduler.postprocess(output, {"scored": 3}, {"scored"})
    assert harness.scheduler.postprocess(output, {}, {"scored"}) == []
    assert scored.token_ids == prompt and scored.num_computed_tokens == 9
    harness.scheduler.finish("scored")
    assert harness.manager.num_cache_hit_tokens(Sequence("next", [*prompt, 5])) == 8


def test_out_of_memory_retry_with_a_smaller_budget() -> None:
    harness = make_harness(max_num_batched_tokens=16)
    scheduler = harness.scheduler
    seq = harness.add("a", list(range(1, 31)), max_tokens=2)
    failed = scheduler.schedule()
    assert failed.num_batched_tokens == 16
    with pytest.raises(RunnerOutOfMemory):
        harness.runner.run(failed, fail=True)
    assert scheduler.shrink_token_budget() == 8
    retry = scheduler.schedule()
    assert chunk_sizes(retry) == {"a": 8}
    with pytest.raises(ValueError, match="latest schedule"):
        scheduler.postprocess(failed, {})
    scheduler.postprocess(retry, harness.runner.run(retry))
    with pytest.raises(ValueError, match="stale"):
        failed.scheduled[0].to_chunk()
    assert seq.num_computed_tokens == 8
    assert scheduler.restore_token_budget() == 16
    assert scheduler.restore_token_budget() == 16
    harness.drain()
    assert seq.token_ids == reference_tokens(list(range(1, 31)), 2)


def test_token_budget_floor_is_one() -> None:
    harness = make_harness(max_num_batched_tokens=8)
    scheduler = harness.scheduler
    assert [scheduler.shrink_token_budget() for _ in range(5)] == [4, 2, 1, 1, 1]
    for index in range(3):
        harness.add(f"s{index}", [index + 1], max_tokens=2)
    output = harness.step()
    assert output.num_batched_tokens == 1
    assert [scheduler.restore_token_budget() for _ in range(4)] == [4, 8, 8, 8]


def test_length_cap_is_reported_and_must_be_finished() -> None:
    harness = make_harness(max_model_len=8)
    scheduler = harness.scheduler
    seq = Sequence("a", list(range(1, 7)))
    scheduler.add(seq)
    full = Sequence("full", list(range(1, 9)))  # prompt == max_model_len
    scheduler.add(full)
    also_full = Sequence("also-full", list(range(2, 10)))
    scheduler.add(also_full)
    output = scheduler.schedule()
    assert scheduler.postprocess(output, harness.runner.run(output)) == [full, also_full]
    with pytest.raises(RuntimeError, match=r"max_model_len first: also-full, full$"):
        scheduler.schedule()
    scheduler.finish("full")
    scheduler.finish("also-full")
    output = scheduler.schedule()
    assert scheduler.postprocess(output, harness.runner.run(output)) == [seq]
    assert seq.num_tokens == 8
    scheduler.abort("a")
    assert scheduler.schedule().is_empty


def test_scheduled_chunk_validates_and_detects_staleness() -> None:
    seq = Sequence("a", [1, 2, 3])
    with pytest.raises(ValueError, match=">= 1"):
        ScheduledSeq(seq, 0)
    with pytest.raises(ValueError, match="cannot schedule 4"):
        ScheduledSeq(seq, 4)
    chunk = ScheduledSeq(seq, 2)
    assert (chunk.start_pos, chunk.needs_logits) == (0, False)
    assert chunk.to_chunk().token_ids == (1, 2)
    seq.num_computed_tokens = 2
    with pytest.raises(ValueError, match="stale"):
        chunk.to_chunk()
    assert ScheduledSeq(seq, 1).needs_logits


# -- starvation and randomised simulation -----------------------------------------


def test_steady_stream_does_not_starve_the_oldest() -> None:
    # Overloaded: one arrival per step, far more than the engine serves, in a
    # pool small enough to force preemptions.  Admission is FIFO within a
    # priority and victims are the newest, so nobody starves: a sequence can
    # finish before an older one only if they ran side by side (a short prompt
    # admitted beside a longer prefill), so it passes fewer than max_num_seqs.
    harness = make_harness(
        num_blocks=16, block_size=2, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=32
    )
    rng = random.Random(3)
    for step in range(300):
        harness.add(f"s{step}", [rng.randint(1, 9) for _ in range(rng.randint(1, 12))], 8)
        harness.step()
        oldest_left = min(int(seq_id[1:]) for seq_id in harness.live)
        assert all(int(seq.seq_id[1:]) < oldest_left + 4 for seq in harness.done)
    assert len(harness.done) > 50
    assert sum(seq.num_preemptions for seq in harness.done) > 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_simulation_keeps_every_invariant(seed: int) -> None:
    """1000 steps of random arrivals, shared prefixes, aborts and OOM retries, then a drain."""
    rng = random.Random(seed)
    harness = make_harness(
        num_blocks=40, block_size=4, max_num_seqs=8, max_num_batched_tokens=32, max_model_len=64
    )
    scheduler = harness.scheduler
    prefixes = [[], [rng.randint(1, VOCAB_SIZE) for _ in range(12)], [7] * 8, [1, 2, 3]]
    arrived_at: dict[str, int] = {}
    finished_at: dict[str, int] = {}
    aborted: set[str] = set()
    last_arrival: tuple[str, list[int], Priority] | None = None
    for num_steps in range(1, 3000):
        if num_steps <= 1000 and rng.random() < 0.3:
            seq_id = f"s{num_steps}"
            prompt = rng.choice(prefixes) + [
                rng.randint(1, VOCAB_SIZE) for _ in range(rng.randint(0, 30))
            ]
            prompt = prompt or [1]
            priority = rng.choice([Priority.ONLINE, Priority.BATCH])
            group = seq_id
            # Now and then n > 1: a sibling of the previous arrival shares its prompt.
            if last_arrival is not None and rng.random() < 0.2:
                group, prompt, priority = last_arrival
            harness.add(seq_id, prompt, rng.randint(1, 30), priority, group=group)
            arrived_at[seq_id] = num_steps
            last_arrival = (group, prompt, priority)
        if harness.live and rng.random() < 0.02:
            victim = rng.choice(sorted(harness.live))
            assert scheduler.abort(victim) is harness.live.pop(victim)
            aborted.add(victim)
        if num_steps > 1000 and not scheduler.has_unfinished:
            break
        had_work = scheduler.has_unfinished
        output = scheduler.schedule()
        check_invariants(harness, output)
        # Now and then the runner runs out of memory: shrink the budget and retry.
        while not output.is_empty and rng.random() < 0.05:
            with pytest.raises(RunnerOutOfMemory):
                harness.runner.run(output, fail=True)
            scheduler.shrink_token_budget()
            output = scheduler.schedule()
            check_invariants(harness, output)
        assert output.is_empty is not had_work  # progress whenever there is work
        sampled = harness.runner.run(output)
        capped = scheduler.postprocess(output, sampled)
        scheduler.restore_token_budget()
        harness.finish_stopped(output, capped)
        for seq in harness.done:
            finished_at.setdefault(seq.seq_id, num_steps)
    assert not scheduler.has_unfinished, "simulation did not drain"
    assert_pool_whole(harness.manager)
    assert set(finished_at) | aborted == set(arrived_at)
    for seq in harness.done:
        expected = min(harness.max_tokens[seq.seq_id], 64 - seq.num_prompt_tokens)
        assert seq.num_output_tokens == max(expected, 1)
        assert seq.token_ids == reference_tokens(seq.prompt_token_ids, seq.num_output_tokens)
    # The run must have exercised the interesting paths.
    assert sum(seq.num_preemptions for seq in harness.done) > 0
    assert sum(seq.num_cached_tokens for seq in harness.done) > 0
    assert max(finished_at[s] - arrived_at[s] for s in finished_at) < 200
