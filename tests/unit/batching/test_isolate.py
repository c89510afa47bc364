"""Bisection isolates exactly the failing inputs; OOM halves; contract breaks are loud."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.batching.isolate import run_isolated
from conveyor.errors import InputRejected, ModelContractError, ModelFault, ModelOutOfMemory


class Recorder:
    """A fake model: doubles numbers, fails on the bad ones, OOMs above a size."""

    def __init__(
        self, bad: set[int] = frozenset(), oom_above: int | None = None, crash: bool = False
    ):
        self.bad = bad
        self.oom_above = oom_above
        self.crash = crash
        self.calls: list[list[int]] = []

    def __call__(self, payloads: list[Any]) -> list[int]:
        self.calls.append(list(payloads))
        if self.oom_above is not None and len(payloads) > self.oom_above:
            raise ModelOutOfMemory("too big")
        if any(p in self.bad for p in payloads):
            if self.crash:
                raise RuntimeError("kernel exploded")
            raise InputRejected("bad input")
        return [p * 2 for p in payloads]


def never_oom(size: int) -> int:
    raise AssertionError("no OOM expected")


def test_clean_batch_runs_once() -> None:
    model = Recorder()
    assert run_isolated(model, [1, 2, 3], cap=10, on_oom=never_oom) == [2, 4, 6]
    assert model.calls == [[1, 2, 3]]


@pytest.mark.parametrize("bad", [{0}, {7}, {3, 4}, {0, 15}, set(range(16))])
def test_only_failing_inputs_get_errors(bad: set[int]) -> None:
    model = Recorder(bad=bad)
    results = run_isolated(model, list(range(16)), cap=16, on_oom=never_oom)
    for value, result in zip(range(16), results, strict=True):
        if value in bad:
            assert isinstance(result, InputRejected)
        else:
            assert result == value * 2


def test_bisection_calls_are_logarithmic_for_one_bad_input() -> None:
    model = Recorder(bad={5})
    run_isolated(model, list(range(16)), cap=16, on_oom=never_oom)
    # 1 full call, then two halves per level down to the single input: 1 + 2 * 4.
    assert len(model.calls) == 9


def test_generic_exception_becomes_model_fault_500() -> None:
    model = Recorder(bad={2}, crash=True)
    results = run_isolated(model, [1, 2, 3], cap=3, on_oom=never_oom)
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], ModelFault) and results[1].status_code == 500
    assert "kernel exploded" in results[1].message


def test_oom_halves_and_reports_new_cap() -> None:
    model = Recorder(oom_above=4)
    seen: list[int] = []

    def on_oom(size: int) -> int:
        seen.append(size)
        return size // 2

    results = run_isolated(model, list(range(10)), cap=10, on_oom=on_oom)
    assert results == [v * 2 for v in range(10)]
    # 10 -> OOM, cap 5 -> OOM again, cap 2: every later call fits and obeys the cap.
    assert seen == [10, 5]
    assert [len(call) for call in model.calls] == [10, 5, 2, 2, 1, 2, 2, 1]


def test_single_input_oom_is_a_model_fault() -> None:
    model = Recorder(oom_above=0)
    results = run_isolated(model, [1], cap=1, on_oom=lambda size: 1)
    assert isinstance(results[0], ModelFault) and results[0].code == "out_of_memory"


def test_wrong_number_of_outputs_fails_every_input_loudly() -> None:
    def short(payloads: list[Any]) -> list[int]:
        return [1]

    results = run_isolated(short, [1, 2, 3], cap=3, on_oom=never_oom)
    assert all(isinstance(r, ModelContractError) for r in results)
    assert "1 outputs for a batch of 3" in results[0].message


def test_cap_splits_batch_before_running() -> None:
    model = Recorder()
    run_isolated(model, list(range(7)), cap=3, on_oom=never_oom)
    assert [len(c) for c in model.calls] == [3, 3, 1]


def test_too_many_outputs_fail_every_input_loudly() -> None:
    """A model that answers with more outputs than inputs breaks the contract as well."""

    def chatty(payloads: list[Any]) -> list[int]:
        return [*payloads, 99]

    results = run_isolated(chatty, [1, 2, 3], cap=3, on_oom=never_oom)
    assert all(isinstance(r, ModelContractError) for r in results)
    assert "4 outputs for a batch of 3" in results[0].message


def test_cap_of_one_runs_each_input_alone() -> None:
    model = Recorder()
    assert run_isolated(model, [1, 2, 3], cap=1, on_oom=never_oom) == [2, 4, 6]
    assert model.calls == [[1], [2], [3]]


def test_oom_at_two_falls_back_to_single_inputs() -> None:
    model = Recorder(oom_above=1)
    assert run_isolated(model, [1, 2], cap=2, on_oom=lambda size: 1) == [2, 4]
    assert model.calls == [[1, 2], [1], [2]]


def test_oom_never_retries_above_half_the_failed_size() -> None:
    """Even when the governor reports a larger cap, an OOM at n retries at n // 2 at most."""
    model = Recorder(oom_above=2)
    assert run_isolated(model, [1, 2, 3, 4], cap=4, on_oom=lambda size: 100) == [2, 4, 6, 8]
    assert [len(c) for c in model.calls] == [4, 2, 2]


def test_an_oom_inside_a_bisected_half_still_halves() -> None:
    """A fault splits the batch; an OOM in a half is then handled like any other OOM."""
    calls: list[list[int]] = []

    def flaky(payloads: list[Any]) -> list[int]:
        calls.append(list(payloads))
        if len(calls) == 1:
            raise RuntimeError("transient fault")
        if len(payloads) > 1:
            raise ModelOutOfMemory("too big")
        return [p * 2 for p in payloads]

    ooms: list[int] = []
    results = run_isolated(flaky, [1, 2, 3, 4], cap=4, on_oom=lambda size: ooms.append(size) or 1)
    assert results == [2, 4, 6, 8]
    assert ooms == [2, 2]
    assert [len(c) for c in calls] == [4, 2, 1, 1, 2, 1, 1]


def test_a_lowered_cap_never_rises_again_within_one_run() -> None:
    """A half split off before the cap fell to 1 runs its inputs alone after its own OOM,
    though the governor reports a larger cap by then (it may have probed back up)."""
    sizes: list[int] = []

    def model(payloads: list[Any]) -> list[int]:
        sizes.append(len(payloads))
        if len(payloads) == 8:
            raise RuntimeError("a fault: the batch is split in halves")
        if len(payloads) > 1:
            raise ModelOutOfMemory("too big")
        return [p * 2 for p in payloads]

    results = run_isolated(model, list(range(8)), cap=8, on_oom=lambda size: 8)
    assert results == [p * 2 for p in range(8)]
    assert sizes == [8, 4, 2, 1, 1, 1, 1, 4, 1, 1, 1, 1]
