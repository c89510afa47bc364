"""Pure region rules: a tenant's residency, and a gateway's preference for its own region.

Workers and gateways carry a ``region`` label. A tenant pinned to regions
(``tenants[].regions``) is served only by workers in them: :func:`in_regions` narrows the
candidates, and when none is left the request gets 503, never a worker elsewhere. A
gateway prefers workers of its own region while the least loaded of them is within
``load_bound`` of the least loaded anywhere (:func:`prefer_home`), then takes any.

No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = ["RegionSettings", "Regional", "in_regions", "may_serve", "prefer_home"]


class Regional(Protocol):
    """What the rules read of a worker (``router.WorkerView`` is one)."""

    @property
    def region(self) -> str | None:
        """Its region label (None: unlabelled)."""


W = TypeVar("W", bound=Regional)


@dataclass(frozen=True, slots=True)
class RegionSettings:
    """A gateway's region and how much busier its own region's workers may be."""

    home: str | None = None
    # In the router's load units (requests in flight from this gateway + reported queue).
    load_bound: int = 8

    def __post_init__(self) -> None:
        """Validate the knobs."""
        if self.load_bound < 0:
            raise ValueError(f"region load_bound must be >= 0, got {self.load_bound}")
        if self.home is not None and not self.home:
            raise ValueError("a region label must not be empty")


def may_serve(regions: Collection[str] | None, here: str | None) -> bool:
    """Whether a process of region ``here`` (None: unlabelled) may run the work of a tenant
    pinned to ``regions`` (None: any region)."""
    return regions is None or here in regions


def in_regions(workers: Sequence[W], regions: Collection[str] | None) -> list[W]:
    """The workers a request pinned to ``regions`` may use (None: every worker)."""
    if regions is None:
        return list(workers)
    return [worker for worker in workers if worker.region in regions]


def prefer_home(
    workers: Sequence[W], settings: RegionSettings, load: Callable[[W], int]
) -> list[W]:
    """The home region's workers while the least loaded of them is within the bound of the
    least loaded of all; else all of them."""
    if settings.home is None:
        return list(workers)
    home = [worker for worker in workers if worker.region == settings.home]
    if not home or len(home) == len(workers):
        return list(workers)
    least_home = min(load(worker) for worker in home)
    least_all = min(load(worker) for worker in workers)
    return home if least_home <= least_all + settings.load_bound else list(workers)
