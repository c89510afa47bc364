"""The pure job policy: the batch lifecycle, live leases and straggler speculation."""

from __future__ import annotations

import pytest

from conveyor.jobs.leases import (
    ACTIVE_BATCH_STATUSES,
    BATCH_TRANSITIONS,
    TERMINAL_BATCH_STATUSES,
    SpeculationPolicy,
    can_transition,
    check_transition,
    is_live,
)
from conveyor.stores.records import BatchStatus


def test_terminal_statuses_are_exactly_those_with_no_way_out() -> None:
    assert set(BATCH_TRANSITIONS) == set(BatchStatus)
    assert {s for s, targets in BATCH_TRANSITIONS.items() if not targets} == set(
        TERMINAL_BATCH_STATUSES
    )
    assert set(ACTIVE_BATCH_STATUSES) == set(BatchStatus) - TERMINAL_BATCH_STATUSES


def test_nothing_leads_back_to_validating_and_every_batch_can_end() -> None:
    assert not any(BatchStatus.VALIDATING in targets for targets in BATCH_TRANSITIONS.values())
    for status in ACTIVE_BATCH_STATUSES:
        assert BATCH_TRANSITIONS[status] & (TERMINAL_BATCH_STATUSES | {BatchStatus.CANCELLING})


@pytest.mark.parametrize(
    ("sources", "target"),
    [
        ([BatchStatus.COMPLETED], BatchStatus.IN_PROGRESS),
        ([BatchStatus.VALIDATING], BatchStatus.COMPLETED),
        ([BatchStatus.VALIDATING, BatchStatus.FINALIZING], BatchStatus.CANCELLING),
    ],
)
def test_forbidden_edges_are_refused(sources: list[BatchStatus], target: BatchStatus) -> None:
    assert not all(can_transition(s, target) for s in sources)
    with pytest.raises(ValueError, match="cannot move"):
        check_transition(sources, target)


def test_allowed_edges_pass_and_an_empty_source_list_does_not() -> None:
    check_transition([BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS], BatchStatus.CANCELLING)
    with pytest.raises(ValueError, match="at least one"):
        check_transition([], BatchStatus.FAILED)


def test_a_lease_expires_at_its_expiry_time() -> None:
    assert is_live(100.0, now=99.999)
    assert not is_live(100.0, now=100.0)
    assert not is_live(100.0, now=101.0)
    assert not is_live(None, now=0.0)


def test_a_straggler_runs_past_both_thresholds() -> None:
    policy = SpeculationPolicy(slow_factor=3.0, min_running_s=5.0)
    assert not policy.is_straggler(100.0, [])  # no committed shard yet: no median
    assert not policy.is_straggler(4.0, [1.0])  # past 3x the median, but too young
    assert not policy.is_straggler(6.0, [2.0, 2.0, 10.0])  # 6 s is exactly 3x the median
    assert policy.is_straggler(6.1, [2.0, 2.0, 10.0])
    assert policy.is_straggler(5.0, [1.0])  # exactly min_running_s is old enough


def test_speculation_accepts_the_edges_of_its_ranges() -> None:
    policy = SpeculationPolicy(slow_factor=1.0, min_running_s=0.0)
    assert policy.is_straggler(0.5, [0.4])  # any shard slower than the median, at once
    for bad in ({"slow_factor": 0.9}, {"min_running_s": -0.1}):
        with pytest.raises(ValueError):
            SpeculationPolicy(**bad)
