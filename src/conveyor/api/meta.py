"""Model list, liveness, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from conveyor.api.responses import json_response
from conveyor.service import Service

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    """OpenAI's model list: every model this service hosts."""
    service: Service = request.app.state.service
    entries = [(h.config.name, h.created_at) for h in service.models()]
    # Under a memory budget a model not loaded yet is still hosted: it loads on first use.
    entries += [(m.name, service.started_at) for m in service.unloaded_models()]
    entries += [(g.config.name, g.created_at) for g in service.generators.values()]
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "conveyor"}
        for name, created in entries
    ]
    return json_response({"object": "list", "data": data})


@router.get("/health")
async def health() -> Response:
    """Alive: the process answers."""
    return json_response({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Ready: every model loaded and accepting inputs (503 until then)."""
    service: Service = request.app.state.service
    if service.is_ready:
        names = [h.config.name for h in service.models()]
        names += [m.name for m in service.unloaded_models()] + list(service.generators)
        return json_response({"status": "ready", "models": names})
    return json_response({"status": "loading"}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition of this service's registry."""
    service: Service = request.app.state.service
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
