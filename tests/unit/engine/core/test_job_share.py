"""The cap on batch-job tokens a step while online traffic is present (``job_share``)."""

from __future__ import annotations

import random

import pytest

from conveyor.engine.core.job_share import JobShare, JobShareConfig
from conveyor.engine.core.sequence import Priority
from conveyor.engine.core.step_plan import SchedulerOutput
from tests.unit.engine.core.test_scheduler import (
    Harness,
    assert_pool_whole,
    chunk_sizes,
    make_harness,
    reference_tokens,
)


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def capped_harness(cap: int, clock: FakeClock | None = None, **kwargs: int) -> Harness:
    """A harness whose scheduler caps job tokens at ``cap`` beside online traffic."""
    share = JobShare(JobShareConfig(cap, linger_s=1.0), clock or FakeClock())
    return make_harness(job_share=share, **kwargs)


def job_tokens(output: SchedulerOutput) -> int:
    """Tokens the step gave batch-job sequences."""
    return sum(c.num_new_tokens for c in output.scheduled if c.seq.priority is Priority.BATCH)


# -- the policy alone --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "linger_s", "match"),
    [(0, 1.0, "max_job_tokens"), (True, 1.0, "max_job_tokens"), (4, -1.0, "linger_s")],
)
def test_config_rejects_bad_values(cap: int, linger_s: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        JobShareConfig(cap, linger_s=linger_s)


@pytest.mark.parametrize("linger_s", [0.0, 0.5])
def test_config_accepts_the_edges_of_its_ranges(linger_s: float) -> None:
    assert JobShareConfig(1, linger_s=linger_s).linger_s == linger_s


def test_the_cap_still_holds_exactly_linger_s_after_online_traffic() -> None:
    clock = FakeClock()
    share = JobShare(JobShareConfig(4, linger_s=2.0), clock)
    share.job_token_cap(has_online=True)
    clock.now_s += 2.0
    assert share.job_token_cap(has_online=False) == 4  # gone for longer than linger_s lifts it


def test_no_cap_before_any_online_traffic() -> None:
    share = JobShare(JobShareConfig(4), FakeClock())
    assert share.job_token_cap(has_online=False) is None


def test_the_cap_holds_while_online_traffic_is_present_and_lingers() -> None:
    clock = FakeClock()
    share = JobShare(JobShareConfig(4, linger_s=1.0), clock)
    assert share.job_token_cap(has_online=True) == 4
    clock.now_s += 0.9
    assert share.job_token_cap(has_online=False) == 4  # an online caller was here just now
    clock.now_s += 0.2
    assert share.job_token_cap(has_online=False) is None  # quiet for longer than linger_s
    assert share.job_token_cap(has_online=True) == 4


def test_no_cap_configured_means_the_job_may_take_every_step() -> None:
    share = JobShare(JobShareConfig(None), FakeClock())
    assert share.job_token_cap(has_online=True) is None


# -- in the scheduler --------------------------------------------------------------------------


def test_job_decodes_beyond_the_cap_sit_out_beside_an_online_request() -> None:
    harness = capped_harness(3, max_num_seqs=8)
    for i in range(6):
        harness.add(f"job{i}", [i + 1, 2], max_tokens=20, priority=Priority.BATCH)
    assert job_tokens(harness.step()) == 12  # no online traffic: the job's whole step
    assert job_tokens(harness.step()) == 6
    harness.add("online", [7, 8, 9], max_tokens=5, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"online": 3}  # its prefill step: jobs sit out
    step = chunk_sizes(harness.step())
    assert step == {"online": 1, "job0": 1, "job1": 1, "job2": 1}  # oldest jobs first
    assert all(s.block_table for s in harness.live.values())  # those left out keep blocks


def test_online_tokens_are_never_capped() -> None:
    harness = capped_harness(1, max_num_batched_tokens=32)
    harness.add("job", [1, 2], max_tokens=20, priority=Priority.BATCH)
    harness.step()
    harness.add("online", list(range(1, 13)), max_tokens=2, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"online": 12}


def test_a_job_prefill_is_chunked_to_the_cap_beside_online_traffic() -> None:
    harness = capped_harness(4, max_num_batched_tokens=32)
    harness.add("online", [1, 2, 3], max_tokens=30, priority=Priority.ONLINE)
    harness.step()
    job = harness.add("job", list(range(1, 11)), max_tokens=1, priority=Priority.BATCH)
    sizes = [chunk_sizes(harness.step()) for _ in range(3)]
    assert sizes == [{"online": 1, "job": 4}, {"online": 1, "job": 4}, {"online": 1, "job": 2}]
    assert job.num_output_tokens == 1


def test_a_running_online_prefill_is_never_capped_by_the_job_share() -> None:
    """The job cap binds batch-job tokens only: an online prompt prefilled over several
    steps takes what the step has, beside an online arrival too."""
    harness = capped_harness(4, max_num_batched_tokens=32)
    harness.add("long", list(range(1, 61)), max_tokens=1, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"long": 32}
    harness.add("short", [1, 2, 3], max_tokens=1, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"long": 28, "short": 3}  # the rest of its prompt
    harness.add("first", list(range(100, 160)), max_tokens=1, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"first": 32}
    harness.add("second", list(range(200, 260)), max_tokens=1, priority=Priority.ONLINE)
    assert chunk_sizes(harness.step()) == {"first": 16, "second": 16}  # half the step each


def test_the_cap_holds_while_an_online_request_runs_past_linger_s() -> None:
    clock = FakeClock()
    harness = capped_harness(2, clock, max_num_seqs=8)
    harness.add("online", [1, 2], max_tokens=30, priority=Priority.ONLINE)
    for i in range(5):
        harness.add(f"job{i}", [i + 1, 2], max_tokens=30, priority=Priority.BATCH)
    harness.step()
    clock.now_s += 5.0  # no online arrival since, but the online request still decodes
    step = chunk_sizes(harness.step())
    assert step["online"] == 1 and job_tokens(harness.step()) == 2


def test_the_cap_lifts_once_online_traffic_has_been_gone_for_linger_s() -> None:
    clock = FakeClock()
    harness = capped_harness(2, clock, max_num_seqs=8)
    harness.add("online", [1, 2], max_tokens=1, priority=Priority.ONLINE)
    for i in range(5):
        harness.add(f"job{i}", [i + 1, 2], max_tokens=30, priority=Priority.BATCH)
    assert chunk_sizes(harness.step()) == {"online": 2, "job0": 2}  # online done, job capped
    assert job_tokens(harness.step()) == 2  # still within linger_s of the online caller
    clock.now_s += 1.5
    assert job_tokens(harness.step()) > 2


def test_the_job_finishes_under_constant_online_traffic_with_exact_outputs() -> None:
    rng = random.Random(7)
    harness = capped_harness(3, max_num_seqs=6, max_num_batched_tokens=16, num_blocks=96)
    jobs = {
        f"job{i}": harness.add(f"job{i}", [rng.randint(1, 40) for _ in range(rng.randint(2, 9))],
                               max_tokens=rng.randint(1, 8), priority=Priority.BATCH)
        for i in range(12)
    }  # fmt: skip
    expected = {k: reference_tokens(s.token_ids, harness.max_tokens[k]) for k, s in jobs.items()}
    num_online = 0
    for _ in range(400):
        if not any(s.priority is Priority.ONLINE for s in harness.live.values()):
            prompt = [rng.randint(1, 40) for _ in range(rng.randint(1, 6))]
            harness.add(f"online{num_online}", prompt, max_tokens=3)
            num_online += 1
        assert job_tokens(harness.step()) <= 3
        if not any(s.priority is Priority.BATCH for s in harness.live.values()):
            break
    assert {s.seq_id: s.token_ids for s in harness.done if s.seq_id in jobs} == expected
    harness.drain()
    assert_pool_whole(harness.manager)
