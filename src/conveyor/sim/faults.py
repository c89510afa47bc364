"""Faults on the virtual clock: a worker killed, a straggler, a region or gateway lost,
stale heartbeats, a store outage.

A killed process resets its connections: each attempt in flight fails at once (a transport
error the gateway retries elsewhere: no byte reached the caller). A lost region is
unreachable instead: its attempts hang until the deadline, new ones until the connect
timeout. Both stop heartbeating, so gateways see the rows go stale and then reaped.
"""

from __future__ import annotations

from collections.abc import Callable

from conveyor.sim.fleet import Fleet
from conveyor.sim.scenario import FaultSpec
from conveyor.sim.worker import TRANSPORT_ERROR, SimWorker


def schedule_faults(
    fleet: Fleet, faults: list[FaultSpec], on_death: Callable[[SimWorker], None]
) -> None:
    """Put every fault (and its end, where it has one) on the clock."""
    for fault in faults:
        fleet.clock.at(fault.at_s, _start, fleet, fault, on_death)
        if fault.until_s is not None:
            fleet.clock.at(fault.until_s, _end, fleet, fault)


def _named_worker(fleet: Fleet, fault: FaultSpec) -> SimWorker:
    if fault.worker is None or fault.worker not in fleet.workers:
        raise ValueError(f"{fault.kind} needs a known worker, got {fault.worker!r}")
    return fleet.workers[fault.worker]


def kill_worker(fleet: Fleet, worker: SimWorker, *, resets: bool) -> None:
    """The worker's process dies; its callers see a reset (``resets``) or nothing at all."""
    for request, reply in worker.kill():
        if resets:
            reply(request, TRANSPORT_ERROR, 0.0)
    if not resets:
        worker.is_reachable = False
    fleet.metrics.add("workers_killed", fleet.clock.now)


def _start(fleet: Fleet, fault: FaultSpec, on_death: Callable[[SimWorker], None]) -> None:
    kind = fault.kind
    if kind == "kill_worker":
        worker = _named_worker(fleet, fault)
        kill_worker(fleet, worker, resets=True)
        on_death(worker)
    elif kind == "straggler":
        _named_worker(fleet, fault).slowdown = fault.slowdown
    elif kind == "lose_region":
        for worker in [w for w in fleet.workers.values() if w.region == fault.region]:
            kill_worker(fleet, worker, resets=False)
            on_death(worker)
        for gateway in fleet.gateways.values():
            if gateway.region == fault.region:
                fleet.kill_gateway(gateway)
    elif kind == "lose_gateway":
        if fault.gateway not in fleet.gateways:
            raise ValueError(f"lose_gateway needs a known gateway, got {fault.gateway!r}")
        fleet.kill_gateway(fleet.gateways[fault.gateway])
    elif kind == "stale_heartbeats":
        fleet.muted.add(_named_worker(fleet, fault).worker_id)
    elif kind == "store_outage":
        fleet.store.is_down = True


def _end(fleet: Fleet, fault: FaultSpec) -> None:
    if fault.kind == "straggler":
        _named_worker(fleet, fault).slowdown = 1.0
    elif fault.kind == "stale_heartbeats":
        fleet.muted.discard(_named_worker(fleet, fault).worker_id)
    elif fault.kind == "store_outage":
        fleet.store.is_down = False
