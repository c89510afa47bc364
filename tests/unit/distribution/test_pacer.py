"""The byte pacer behind the chunk server's upload cap, on a fake clock."""

from __future__ import annotations

import pytest

from conveyor.distribution.pacer import BytePacer


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_burst_goes_at_once_then_bytes_wait_for_their_share_of_the_rate() -> None:
    clock = FakeClock()
    pacer = BytePacer(1000.0, burst_bytes=500, clock=clock)
    assert pacer.reserve(500) == 0.0
    assert pacer.reserve(1000) == pytest.approx(1.0)
    assert pacer.reserve(250) == pytest.approx(1.25)


def test_senders_sharing_a_pacer_share_the_rate() -> None:
    clock = FakeClock()
    pacer = BytePacer(1000.0, burst_bytes=0, clock=clock)
    waits = [pacer.reserve(100) for _ in range(10)]  # ten pieces, say from two connections
    assert waits[-1] == pytest.approx(1.0)  # 1000 bytes at 1000 B/s, whoever sent them


def test_idle_time_refills_only_up_to_the_burst() -> None:
    clock = FakeClock()
    pacer = BytePacer(1000.0, burst_bytes=200, clock=clock)
    pacer.reserve(1000)
    clock.now_s += 60.0
    assert pacer.reserve(200) == 0.0
    assert pacer.reserve(100) == pytest.approx(0.1)


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate_bytes_s"):
        BytePacer(0.0)
