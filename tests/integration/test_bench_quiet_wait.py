"""The benchmarks' bounded wait for a quiet machine (``bench.common.wait_until_quiet``), on a
fake clock and a fake /proc: its bound holds even when it is shorter than the quiet window,
so a smoke run's ``max_wait_s=0`` on a busy machine costs one poll, not the window."""

from __future__ import annotations

from types import SimpleNamespace

import bench.common as common
import pytest


class FakeMachine:
    """A clock that sleeping advances, and one other process using ``pct`` of a core."""

    def __init__(self, pct: float) -> None:
        self.now = 0.0
        self.pct = pct

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def snapshot(self) -> common.CpuSnapshot:
        ticks = int(self.now * common.CLOCK_TICKS_PER_S * self.pct / 100)
        return common.CpuSnapshot(self.now, {1: ticks}, {1: "other"}, ticks)


def patched(monkeypatch: pytest.MonkeyPatch, pct: float) -> FakeMachine:
    machine = FakeMachine(pct)
    fake_time = SimpleNamespace(sleep=machine.sleep, monotonic=lambda: machine.now)
    monkeypatch.setattr(common, "time", fake_time)
    monkeypatch.setattr(common, "take_cpu_snapshot", machine.snapshot)
    return machine


@pytest.mark.parametrize(("max_wait_s", "waited_s"), [(0.0, 0.25), (0.5, 0.5), (10.0, 10.0)])
def test_a_busy_machine_is_waited_for_no_longer_than_the_bound(
    monkeypatch: pytest.MonkeyPatch, max_wait_s: float, waited_s: float
) -> None:
    patched(monkeypatch, pct=100.0)
    report = common.wait_until_quiet(max_wait_s=max_wait_s)
    assert report.is_busy and report.busiest_name == "other"
    assert report.waited_s == pytest.approx(waited_s)
    assert report.busiest_pct == pytest.approx(100.0, abs=1.0)


def test_a_quiet_machine_is_judged_over_the_whole_window(monkeypatch: pytest.MonkeyPatch) -> None:
    patched(monkeypatch, pct=1.0)
    report = common.wait_until_quiet(quiet_s=2.0, max_wait_s=10.0)
    assert not report.is_busy
    assert report.waited_s == pytest.approx(2.0)
