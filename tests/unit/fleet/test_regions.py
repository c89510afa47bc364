"""Regions, pure: a resident tenant's workers only, the gateway's own region within a bound,
and the router applying both."""

from __future__ import annotations

import random

import pytest

from conveyor.fleet.regions import RegionSettings, in_regions, may_serve, prefer_home
from conveyor.fleet.router import Ejections, Router, WorkerView

M = "m"


def worker(worker_id: str, region: str | None) -> WorkerView:
    return WorkerView(
        worker_id, f"http://{worker_id}", frozenset({M}), frozenset({M}), region=region,
        last_heartbeat_at=100.0,
    )  # fmt: skip


EU = [worker("eu1", "eu"), worker("eu2", "eu")]
US = [worker("us1", "us")]
ALL = [*EU, *US, worker("plain", None)]


def test_a_resident_tenant_gets_only_its_regions() -> None:
    assert in_regions(ALL, None) == ALL
    assert in_regions(ALL, {"eu"}) == EU
    assert in_regions(ALL, {"eu", "us"}) == [*EU, *US]
    assert in_regions(ALL, {"ap"}) == []


def test_home_is_preferred_within_the_bound_then_any() -> None:
    settings = RegionSettings(home="us", load_bound=2)
    loads = {"eu1": 0, "eu2": 0, "us1": 2, "plain": 0}
    load = lambda w: loads[w.worker_id]  # noqa: E731
    assert prefer_home(ALL, settings, load) == US  # 2 <= 0 + 2
    loads["us1"] = 3
    assert prefer_home(ALL, settings, load) == ALL  # beyond the bound: every region
    assert prefer_home(EU, settings, load) == EU  # no home worker: any
    assert prefer_home(ALL, RegionSettings(), load) == ALL  # no home region


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="load_bound"):
        RegionSettings(load_bound=-1)
    with pytest.raises(ValueError, match="empty"):
        RegionSettings(home="")


def test_the_router_keeps_a_resident_request_in_its_regions_whatever_the_load() -> None:
    router = Router(random.Random(0), Ejections(5.0), regions=RegionSettings(home="us"))
    for _ in range(8):
        router.acquire("eu1")
        router.acquire("eu2")
    chosen = [router.choose(ALL, M, 100.0, regions={"eu"}) for _ in range(20)]
    assert {w.worker_id for w in chosen if w} == {"eu1", "eu2"} and None not in chosen
    assert router.choose(ALL, M, 100.0, regions={"ap"}) is None
    assert router.choose(ALL, M, 100.0, regions={"eu"}, exclude={"eu1", "eu2"}) is None


def picked(router: Router) -> str:
    """The id of the worker the router picks now."""
    chosen = router.choose(ALL, M, 100.0)
    assert chosen is not None
    return chosen.worker_id


def test_the_router_prefers_its_home_region_until_it_is_busier_than_the_bound() -> None:
    router = Router(random.Random(0), Ejections(5.0), regions=RegionSettings("eu", 2))
    assert {picked(router) for _ in range(20)} <= {"eu1", "eu2"}
    for name in ("eu1", "eu2"):
        for _ in range(3):
            router.acquire(name)
    assert {picked(router) for _ in range(40)} & {"us1", "plain"}


def test_may_serve_only_inside_a_pinned_tenants_regions() -> None:
    assert may_serve(None, "eu") and may_serve(None, None)
    assert may_serve(("eu", "us"), "us") and may_serve(frozenset({"eu"}), "eu")
    assert not may_serve(("eu",), "us") and not may_serve(("eu",), None)
