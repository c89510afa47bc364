"""Model list and lookup, version, liveness, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from conveyor.api.responses import find_model, version_body
from conveyor.asgi.json import json_response
from conveyor.endpoints.lora_adapters import adapter_entries
from conveyor.host.service import Service

router = APIRouter()


def model_entries(service: Service) -> list[dict[str, object]]:
    """One OpenAI model object per model this service hosts."""
    entries = [(h.config.name, h.created_at) for h in service.models()]
    # Under a memory budget a model not loaded yet is still hosted: it loads on first use.
    entries += [(m.name, service.started_at) for m in service.unloaded_models()]
    entries += [(g.config.name, g.created_at) for g in service.generators.values()]
    models: list[dict[str, object]] = [
        {"id": name, "object": "model", "created": created, "owned_by": "conveyor"}
        for name, created in entries
    ]
    return models + adapter_entries(service)


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    """OpenAI's model list: every model this service hosts."""
    return json_response({"object": "list", "data": model_entries(request.app.state.service)})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: str) -> Response:
    """OpenAI's model object for one hosted model (404 if not hosted)."""
    return json_response(find_model(model_entries(request.app.state.service), model_id))


@router.get("/version")
async def version() -> Response:
    """The running Conveyor version (as vLLM's ``/version``)."""
    return json_response(version_body())


@router.get("/health")
async def health() -> Response:
    """Alive: the process answers."""
    return json_response({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Ready: every configured model loaded and accepting inputs (503 until then).

    A model whose weights could not be fetched (a failed pull) keeps it 503 for good, naming
    the model and why: the process does not host what it was configured to, which a rollout
    must not take for success. Its other models still serve (and a fleet worker registers
    only those, so gateways route by them).
    """
    service: Service = request.app.state.service
    if not service.is_ready:
        return json_response({"status": "loading"}, status_code=503)
    names = [h.config.name for h in service.models()]
    names += [m.name for m in service.unloaded_models()] + list(service.generators)
    if service.failed_models:
        failed = {"status": "failed", "models": names, "failed": dict(service.failed_models)}
        return json_response(failed, status_code=503)
    return json_response({"status": "ready", "models": names})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition of this service's registry."""
    service: Service = request.app.state.service
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
