"""Arrival-rate meter and Little's-law replicas."""

from __future__ import annotations

import pytest

from conveyor.fleet.scaling import ModelDemand, RateMeter, desired_replicas


def demand(arrival: float, service: float, *, queue: int = 0, replicas: int = 2) -> ModelDemand:
    return ModelDemand("m", arrival, service, queue, replicas)


def test_rate_is_events_over_the_window() -> None:
    meter = RateMeter(window_s=10)
    for t in range(10):
        meter.record(float(t), 5)
    assert meter.rate_per_s(9.5) == pytest.approx(5.0)


def test_old_events_leave_the_window() -> None:
    meter = RateMeter(window_s=2)
    meter.record(0.0, 10)
    meter.record(1.5, 4)
    assert meter.rate_per_s(1.9) == pytest.approx(7.0)
    assert meter.rate_per_s(2.0) == pytest.approx(2.0)
    assert meter.rate_per_s(10.0) == 0.0


def test_littles_law() -> None:
    # 300 inputs/s, one replica serves 100/s: 3 busy replicas; at 75% utilisation, 4.
    assert desired_replicas(demand(300, 100), 0.75) == 4
    assert desired_replicas(demand(300, 100), 1.0) == 3
    assert desired_replicas(demand(301, 100), 1.0) == 4


def test_no_traffic_needs_no_replica_unless_there_is_a_backlog() -> None:
    assert desired_replicas(demand(0, 100), 0.7) == 0
    assert desired_replicas(demand(0, 100, queue=5), 0.7) == 1


def test_unknown_service_rate_keeps_the_current_count() -> None:
    assert desired_replicas(demand(500, 0, replicas=3), 0.7) == 3


@pytest.mark.parametrize("target", [0.0, -0.5, 1.5])
def test_target_utilisation_must_be_a_fraction(target: float) -> None:
    with pytest.raises(ValueError):
        desired_replicas(demand(1, 1), target)


def test_meter_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        RateMeter(window_s=0)
    with pytest.raises(ValueError):
        RateMeter(window_s=1).record(0.0, -1)
