"""What the gateway says about its fleet: ``GET /v1/fleet`` and the union of the models.

Read from the gateway's registry view, router and scaling meters; the routes in
``api.fleet`` (and the dashboard) answer with these documents.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from conveyor.fleet.scaling import desired_replicas

if TYPE_CHECKING:
    from conveyor.gateway.process import Gateway


def model_entries(gateway: Gateway) -> list[dict[str, object]]:
    """OpenAI's model objects, one per model some routable worker hosts."""
    return [
        {"id": name, "object": "model", "created": 0, "owned_by": "conveyor"}
        for name in gateway.healthy_models()
    ]


def _without_digests(load: dict[str, Any]) -> dict[str, Any]:
    """A heartbeat's load minus the prefix digests (``prefix_blocks`` counts them)."""
    models = load.get("models")
    if not isinstance(models, dict):
        return load
    trimmed = {
        name: {k: v for k, v in entry.items() if k != "prefix"}
        if isinstance(entry, dict)
        else entry
        for name, entry in models.items()
    }
    return {**load, "models": trimmed}


def fleet_document(gateway: Gateway) -> dict[str, Any]:
    """``GET /v1/fleet``: every worker with its models, load and heartbeat age."""
    now = time.time()
    workers = []
    for record, view in zip(gateway.registry.records, gateway.registry.views, strict=True):
        workers.append(
            {
                "id": record.worker_id,
                "address": record.address,
                "region": view.region,
                "models": list(record.models),
                "loaded_models": sorted(view.loaded_models),
                "capacity": record.capacity,
                "load": _without_digests(record.load),
                "prefix_blocks": {m: len(h.keys) for m, h in view.prefixes.items()},
                "gateway_in_flight": gateway.router.in_flight(record.worker_id),
                "heartbeat_age_s": round(now - record.last_heartbeat_at, 3),
                "is_stale": view.is_stale,
                "is_draining": view.is_draining or gateway.router.drained.is_draining(view),
                "is_ejected": gateway.router.ejections.is_ejected(view, now),
                "is_routable": gateway.router.is_routable(view, now),
            }
        )
    models = {
        d.model: {
            "num_replicas": d.num_replicas,
            "queue_depth": d.queue_depth,
            "arrival_per_s": round(d.arrival_per_s, 3),
            "service_per_s_per_replica": round(d.service_per_s_per_replica, 3),
            "desired_replicas": desired_replicas(d, gateway.settings.target_utilisation),
        }
        for d in gateway.demands()
    }
    routed = dict(gateway.router.num_routed)
    return {
        "object": "fleet", "region": gateway.settings.regions.home, "workers": workers,
        "models": models, "routed_by": routed, "failover": _failover(gateway, now),
    }  # fmt: skip


def _failover(gateway: Gateway, now: float) -> dict[str, Any]:
    """The admission ramp after a lost region: whether it runs, since when, what it lost."""
    ramp = gateway.failover
    return {
        "is_ramping": ramp.is_ramping(now),
        "started_at": ramp.started_at,
        "lost_regions": sorted(ramp.lost),
        "ramp_s": ramp.settings.ramp_s,
    }
