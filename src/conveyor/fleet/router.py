"""Pure routing: pick a healthy worker for a model by power of two choices on its load.

Nothing here does I/O (beyond logging an ejection) or reads a clock; callers pass ``now``
and a seeded ``random.Random``, so every decision can be replayed in tests.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from conveyor.fleet.affinity import (
    Affinity,
    AffinityReason,
    AffinitySettings,
    Holdings,
    choose_by_affinity,
)
from conveyor.fleet.drain import Drained
from conveyor.fleet.regions import RegionSettings, in_regions, prefer_home
from conveyor.fleet.routed_prefixes import MergedHoldings, RoutedPrefixes
from conveyor.observability.logs import log_event
from conveyor.prefix.report import PrefixHoldings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a gateway knows about one worker from its last heartbeat."""

    worker_id: str
    address: str
    models: frozenset[str]
    loaded_models: frozenset[str]
    queue_depth: Mapping[str, int] = field(default_factory=dict)
    # Per model, the batch-job lines counted in ``queue_depth`` (absent: none).
    batch_depth: Mapping[str, int] = field(default_factory=dict)
    last_heartbeat_at: float = 0.0
    is_stale: bool = False
    is_draining: bool = False
    # Per model: the prefix blocks its engine's cache holds (generative models only).
    prefixes: Mapping[str, PrefixHoldings] = field(default_factory=dict)
    region: str | None = None

    def __post_init__(self) -> None:
        """Reject views that could never come from a real heartbeat."""
        if not self.worker_id:
            raise ValueError("worker_id must be a non-empty string")
        if not self.loaded_models <= self.models:
            raise ValueError("loaded_models must be a subset of models")


class Ejections:
    """Passive ejection: a worker that refused a connection gets no traffic for a while.

    It is re-admitted once ``cooldown_s`` has passed *and* it has sent a heartbeat after the
    ejection, so a worker that died stays out until the registry forgets it.
    """

    def __init__(self, cooldown_s: float) -> None:
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        self.cooldown_s = cooldown_s
        self._ejected_at: dict[str, float] = {}

    def eject(self, worker_id: str, now: float) -> None:
        """Stop routing to ``worker_id`` from ``now``."""
        if worker_id not in self._ejected_at:
            log_event(
                log, logging.WARNING, "worker_ejected",
                f"ejected worker {worker_id} for {self.cooldown_s:g} s", worker_id=worker_id,
            )  # fmt: skip
        self._ejected_at[worker_id] = now

    def is_ejected(self, worker: WorkerView, now: float) -> bool:
        """True while ``worker`` is ejected; forgets the ejection once it is healthy again."""
        ejected_at = self._ejected_at.get(worker.worker_id)
        if ejected_at is None:
            return False
        is_cooled = now >= ejected_at + self.cooldown_s
        if is_cooled and worker.last_heartbeat_at > ejected_at:
            del self._ejected_at[worker.worker_id]
            return False
        return True

    @property
    def num_ejected(self) -> int:
        """Workers ejected now (some may be due for re-admission at their next check)."""
        return len(self._ejected_at)

    def ejected_ids(self) -> frozenset[str]:
        """Ids of the workers ejected now (as ``num_ejected`` counts them)."""
        return frozenset(self._ejected_at)

    def forget_missing(self, present_ids: Collection[str]) -> None:
        """Drop ejections of workers the registry no longer lists."""
        for worker_id in [w for w in self._ejected_at if w not in present_ids]:
            del self._ejected_at[worker_id]


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """Knobs of the choice: how much an unloaded model costs compared with queued inputs."""

    cold_penalty: int = 8

    def __post_init__(self) -> None:
        """Validate the knobs."""
        if self.cold_penalty < 0:
            raise ValueError(f"cold_penalty must be >= 0, got {self.cold_penalty}")


class Router:
    """Chooses workers and counts this gateway's in-flight requests per worker."""

    def __init__(
        self,
        rng: random.Random,
        ejections: Ejections,
        policy: RoutingPolicy | None = None,
        affinity: AffinitySettings | None = None,
        regions: RegionSettings | None = None,
    ) -> None:
        self._rng = rng
        self.ejections = ejections
        self.policy = policy or RoutingPolicy()
        self.regions = regions or RegionSettings()
        # Workers that answered with the drain marker (``fleet.drain``).
        self.drained = Drained()
        # None: requests' prefix and session hints are ignored (load alone decides).
        self.affinity = affinity
        # The prompt blocks routed to each worker (None: only what workers report counts).
        self.routed: RoutedPrefixes | None = None
        if affinity is not None and affinity.use_prefix and affinity.max_routed_blocks:
            self.routed = RoutedPrefixes(affinity.max_routed_blocks)
        self._in_flight: dict[str, int] = {}
        # How many choices each reason made (``AffinityReason``), for ``/v1/fleet``.
        self.num_routed: dict[str, int] = {}
        # Per model, the fresh workers hosting it (warm, cold) in the last ``workers`` seen:
        # the registry replaces its list whole on each refresh, so between refreshes a
        # choice costs O(1), not a scan of every worker (which dominates at 1,000 workers).
        self._pools: dict[str, tuple[Sequence[WorkerView], list[WorkerView], list[WorkerView]]]
        self._pools = {}

    def in_flight(self, worker_id: str) -> int:
        """Requests this gateway has outstanding on ``worker_id``."""
        return self._in_flight.get(worker_id, 0)

    def acquire(self, worker_id: str) -> None:
        """Count a request sent to ``worker_id``."""
        self._in_flight[worker_id] = self._in_flight.get(worker_id, 0) + 1

    def release(self, worker_id: str) -> None:
        """Count a request to ``worker_id`` as finished."""
        remaining = self._in_flight.get(worker_id, 0) - 1
        if remaining > 0:
            self._in_flight[worker_id] = remaining
        else:
            self._in_flight.pop(worker_id, None)

    def load(self, worker: WorkerView, model: str) -> int:
        """The larger of this gateway's requests in flight there and the online depth the
        worker last reported. The report counts every gateway's requests, this gateway's
        among them, but is up to a heartbeat old: with one gateway the exact in-flight
        count wins (a sum would count its requests twice, once stale); with several, the
        report shows what the others sent. Batch-job lines in the report do not count: an
        online request goes before them (and takes their seats and blocks if it must), so
        a worker full of job lines is not busy for it."""
        reported = worker.queue_depth.get(model, 0) - worker.batch_depth.get(model, 0)
        return max(self.in_flight(worker.worker_id), reported)

    def is_routable(self, worker: WorkerView, now: float) -> bool:
        """Fresh heartbeat, not draining (reported, or answered so), not ejected."""
        if worker.is_stale or worker.is_draining or self.drained.is_draining(worker):
            return False
        return not self.ejections.is_ejected(worker, now)

    def candidates(
        self,
        workers: Sequence[WorkerView],
        model: str,
        now: float,
        exclude: Collection[str] = (),
        regions: Collection[str] | None = None,
    ) -> list[WorkerView]:
        """Routable workers hosting ``model`` in ``regions`` (None: any), minus those in
        ``exclude`` (already tried)."""
        warm, cold = self._routable(workers, model, now, exclude, regions)
        order = {id(w): i for i, w in enumerate(workers)} if warm and cold else None
        if order is None:
            return warm + cold
        return sorted(warm + cold, key=lambda w: order[id(w)])

    def _routable(
        self, workers: Sequence[WorkerView], model: str, now: float, exclude: Collection[str],
        regions: Collection[str] | None = None,
    ) -> tuple[list[WorkerView], list[WorkerView]]:  # fmt: skip
        """The routable workers hosting ``model`` in ``regions``: those with it loaded, and
        the others."""
        warm, cold = self._fresh_pools(workers, model)
        if regions is not None:
            warm, cold = in_regions(warm, regions), in_regions(cold, regions)
        if not exclude and not self.ejections.num_ejected and not self.drained.num_marked:
            return warm, cold
        ejected = self.ejections.ejected_ids()

        def keep(worker: WorkerView) -> bool:
            if worker.worker_id in exclude or self.drained.is_draining(worker):
                return False
            return worker.worker_id not in ejected or not self.ejections.is_ejected(worker, now)

        return [w for w in warm if keep(w)], [w for w in cold if keep(w)]

    def _fresh_pools(
        self, workers: Sequence[WorkerView], model: str
    ) -> tuple[list[WorkerView], list[WorkerView]]:
        """Workers hosting ``model``, neither stale nor draining: loaded, not loaded."""
        cached = self._pools.get(model)
        if cached is not None and cached[0] is workers:
            return cached[1], cached[2]
        fresh = [w for w in workers if model in w.models and not w.is_stale and not w.is_draining]
        warm = [w for w in fresh if model in w.loaded_models]
        cold = [w for w in fresh if model not in w.loaded_models]
        self._pools[model] = (workers, warm, cold)
        return warm, cold

    def choose(
        self,
        workers: Sequence[WorkerView],
        model: str,
        now: float,
        exclude: Collection[str] = (),
        affinity: Affinity | None = None,
        regions: Collection[str] | None = None,
    ) -> WorkerView | None:
        """The worker for the next request of ``model``, or None when no worker can take it.

        Only workers in ``regions`` (a resident tenant's) are considered; among them the
        gateway's own region's while within its load bound (``fleet.regions``).

        With affinity settings and a hint, the worker holding the request's longest cached
        prefix (reported, or routed there by this gateway), else its session's worker,
        wins while within the load bound (see ``fleet.affinity``). Otherwise two random
        workers that already have the model loaded are compared on load; when even the
        better one is busier than ``cold_penalty``, one worker without the model loaded
        competes too, its load raised by the penalty (the cost of loading it). The chosen
        worker is remembered as holding the request's prompt blocks.
        """
        worker = self._choose(workers, model, now, exclude, affinity, regions)
        prompt = affinity.prompt if affinity is not None else None
        if worker is not None and prompt is not None and self.routed is not None:
            reported = worker.prefixes.get(model)
            if reported is not None:  # the worker's block size is known
                keys = prompt.keys(reported.block_size)
                self.routed.record(worker.worker_id, model, reported.block_size, keys)
        return worker

    def _choose(
        self,
        workers: Sequence[WorkerView],
        model: str,
        now: float,
        exclude: Collection[str],
        affinity: Affinity | None,
        regions: Collection[str] | None,
    ) -> WorkerView | None:
        """``choose`` without the remembering."""
        warm, cold = self._routable(workers, model, now, exclude, regions)
        if not warm and not cold:
            return None
        warm, cold = self._prefer_home(warm, cold, model)
        if affinity is not None and self.affinity is not None:
            picked = self._by_affinity(warm or cold, model, affinity, self.affinity)
            if picked is not None:
                return picked
        self._count(AffinityReason.LOAD)
        best = self._two_choices(warm, model) if warm else None
        if best is not None and (not cold or self.load(best, model) < self.policy.cold_penalty):
            return best
        challenger = self._two_choices(cold, model)
        if best is None:
            return challenger
        challenger_load = self.load(challenger, model) + self.policy.cold_penalty
        return challenger if challenger_load < self.load(best, model) else best

    def _by_affinity(
        self,
        pool: Sequence[WorkerView],
        model: str,
        affinity: Affinity,
        settings: AffinitySettings,
    ) -> WorkerView | None:
        """The affinity choice among ``pool`` (the workers with the model loaded, or all
        candidates when none has). The load bound weighs this gateway's own requests in
        flight, known exactly: a reported depth counts every running sequence and is up to
        a heartbeat old, so its spread between workers outgrows any small bound and sends
        sessions away from their cached prefixes."""
        choice = choose_by_affinity(
            pool, model, affinity, lambda worker: self.in_flight(worker.worker_id), settings,
            lambda worker: self.holdings(worker, model),
        )  # fmt: skip
        if choice is None:
            return None
        self._count(choice[1])
        return choice[0]

    def _prefer_home(
        self, warm: list[WorkerView], cold: list[WorkerView], model: str
    ) -> tuple[list[WorkerView], list[WorkerView]]:
        """``warm`` and ``cold`` narrowed to the gateway's own region while it is within its
        load bound (``fleet.regions.prefer_home``)."""
        if self.regions.home is None:
            return warm, cold
        kept = prefer_home(warm + cold, self.regions, lambda w: self.load(w, model))
        if len(kept) == len(warm) + len(cold):
            return warm, cold
        home = {id(worker) for worker in kept}
        return [w for w in warm if id(w) in home], [w for w in cold if id(w) in home]

    def holdings(self, worker: WorkerView, model: str) -> Holdings | None:
        """What ``worker`` is taken to hold for ``model``: its report, widened by what this
        gateway routed there; None when it reported nothing (its block size is unknown)."""
        reported = worker.prefixes.get(model)
        if reported is None or self.routed is None:
            return reported
        return MergedHoldings.of(reported, self.routed, worker.worker_id, model)

    def forget_missing(self, present_ids: Collection[str]) -> None:
        """Drop ejections, drain marks and routed blocks of workers the registry no longer
        lists."""
        self.ejections.forget_missing(present_ids)
        self.drained.forget_missing(present_ids)
        if self.routed is not None:
            self.routed.forget_missing(present_ids)

    def _count(self, reason: AffinityReason) -> None:
        self.num_routed[reason.value] = self.num_routed.get(reason.value, 0) + 1

    def _two_choices(self, pool: Sequence[WorkerView], model: str) -> WorkerView:
        """The less loaded of two distinct random members of ``pool`` (ties: the first)."""
        if len(pool) == 1:
            return pool[0]
        first, second = self._rng.sample(pool, 2)
        return second if self.load(second, model) < self.load(first, model) else first
