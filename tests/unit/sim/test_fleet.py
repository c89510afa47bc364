"""The simulated fleet: gateways by region, alive until killed."""

from __future__ import annotations

import random

from conveyor.sim.clock import Clock
from conveyor.sim.fleet import build_fleet
from conveyor.sim.metrics import Metrics
from conveyor.sim.scenario import Scenario


def test_the_live_gateways_of_a_region_are_kept_until_one_is_killed() -> None:
    scenario = Scenario.model_validate({
        "name": "f", "duration_s": 1.0,
        "time_model": {"gpu": "h100"},
        "fleet": {"model": {"name": "embed", "kind": "one_shot"},
                  "regions": [{"name": "a", "workers": 1, "gateways": 2},
                              {"name": "b", "workers": 1, "gateways": 1}]},
        "traffic": [{"kind": "poisson", "rate_rps": 1}],
    })  # fmt: skip
    fleet = build_fleet(scenario, Clock(), Metrics(), random.Random(1))
    ids = lambda gateways: [g.gateway_id for g in gateways]  # noqa: E731
    assert ids(fleet.gateways_in("a")) == ["g0", "g1"] and ids(fleet.gateways_in("b")) == ["g2"]
    assert fleet.gateways_in("a") is fleet.gateways_in("a")  # kept between requests
    fleet.kill_gateway(fleet.gateways["g0"])
    assert ids(fleet.gateways_in("a")) == ["g1"] and ids(fleet.gateways_in(None)) == ["g1", "g2"]
    fleet.kill_gateway(fleet.gateways["g2"])
    assert fleet.gateways_in("b") == [] and ids(fleet.gateways_in(None)) == ["g1"]
