"""Scenario overrides: a fleet-size sweep (``--workers``) and a slice (``--scale``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.sim.scenario import load_scenario, scaled, with_workers

SCENARIOS = Path(__file__).parents[3] / "bench" / "scenarios"


def test_workers_sets_every_region_and_the_slice_scales_it() -> None:
    spec = load_scenario(SCENARIOS / "two-regions.yaml")
    swept = with_workers(spec, 30)
    assert spec.fleet is not None and swept.fleet is not None
    assert [r.workers for r in swept.fleet.regions] == [30] * len(spec.fleet.regions)
    assert [r.gateways for r in swept.fleet.regions] == [r.gateways for r in spec.fleet.regions]
    assert swept.traffic == spec.traffic  # the same traffic over another fleet
    sliced = scaled(with_workers(load_scenario(SCENARIOS / "token-service-100k.yaml"), 6000), 0.01)
    assert sliced.fleet is not None and [r.workers for r in sliced.fleet.regions] == [60]


def test_workers_refuses_none_and_a_scenario_without_a_fleet() -> None:
    spec = load_scenario(SCENARIOS / "two-regions.yaml")
    with pytest.raises(ValueError, match=">= 1"):
        with_workers(spec, 0)
    with pytest.raises(ValueError, match="with a fleet"):
        with_workers(load_scenario(SCENARIOS / "distribution-10k.yaml"), 10)
