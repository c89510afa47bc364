"""The failover admission ramp, pure: a lost region starts it, the bucket widens, it ends."""

from __future__ import annotations

import pytest

from conveyor.fleet.failover import FailoverRamp, FailoverSettings

M = "m"


def admitted(ramp: FailoverRamp, now: float, tries: int) -> int:
    """How many of ``tries`` requests at ``now`` get in."""
    return sum(1 for _ in range(tries) if ramp.admit(M, now) is None)


def test_nothing_is_limited_while_every_region_stays_up() -> None:
    ramp = FailoverRamp(FailoverSettings(ramp_s=10))
    ramp.observe({"eu", "us"}, {M: 10.0}, 0.0)
    ramp.observe({"eu", "us"}, {M: 10.0}, 1.0)
    assert not ramp.is_ramping(1.0) and admitted(ramp, 1.0, 1000) == 1000


def test_a_lost_region_starts_a_ramp_that_widens_then_ends() -> None:
    ramp = FailoverRamp(FailoverSettings(ramp_s=10, start_share=0.1))
    ramp.observe({"eu", "us"}, {M: 10.0}, 0.0)
    ramp.observe({"us"}, {M: 10.0}, 5.0)  # eu is gone: us inherits its traffic
    assert ramp.is_ramping(5.0) and ramp.lost == {"eu"} and ramp.surge == 1.0
    assert ramp.rate_per_s(M, 5.0) == pytest.approx(10 * 1.1)
    assert ramp.rate_per_s(M, 10.0) == pytest.approx(10 * 1.55)
    first = admitted(ramp, 5.0, 100)
    assert first == 11  # one second of the starting rate, as a burst
    wait = ramp.admit(M, 5.0)
    assert wait is not None and wait >= 1
    assert admitted(ramp, 6.0, 100) in (11, 12)  # refilled at the rate of the moment
    ramp.observe({"us"}, {M: 20.0}, 15.0)
    assert not ramp.is_ramping(15.0) and admitted(ramp, 15.0, 1000) == 1000


def test_a_model_without_arrivals_gets_the_floor_rate() -> None:
    ramp = FailoverRamp(FailoverSettings(ramp_s=10, start_share=0.0, min_rate_per_s=2))
    ramp.observe({"eu", "us"}, {}, 0.0)
    ramp.observe({"us"}, {}, 0.0)
    assert ramp.rate_per_s("other", 0.0) == pytest.approx(2.0)
    assert admitted(ramp, 0.0, 10) == 2


def test_no_survivor_or_no_ramp_time_means_no_ramp() -> None:
    ramp = FailoverRamp(FailoverSettings(ramp_s=10))
    ramp.observe({"eu"}, {M: 1.0}, 0.0)
    ramp.observe(set(), {M: 1.0}, 1.0)
    assert not ramp.is_ramping(1.0)
    off = FailoverRamp(FailoverSettings(ramp_s=0))
    off.observe({"eu", "us"}, {M: 1.0}, 0.0)
    off.observe({"us"}, {M: 1.0}, 1.0)
    assert not off.is_ramping(1.0)


def test_a_region_that_comes_back_and_goes_again_restarts_the_ramp() -> None:
    ramp = FailoverRamp(FailoverSettings(ramp_s=10))
    ramp.observe({"eu", "us"}, {M: 1.0}, 0.0)
    ramp.observe({"us"}, {M: 1.0}, 1.0)
    ramp.observe({"eu", "us"}, {M: 1.0}, 20.0)
    assert not ramp.is_ramping(20.0)
    ramp.observe({"eu"}, {M: 1.0}, 30.0)
    assert ramp.is_ramping(30.0) and ramp.lost == {"us"}


@pytest.mark.parametrize(
    "kwargs", [{"ramp_s": -1}, {"start_share": 1.5}, {"min_rate_per_s": 0}, {"burst_s": 0}]
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FailoverSettings(**kwargs)
