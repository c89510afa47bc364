"""The gateway's HTTP routes: fleet status, model union, health, metrics and the proxy's
catch-all route.

The proxy itself (reading, admitting, forwarding, answering) is ``gateway.proxy``; the
app factory that mounts these routes and the proxy's shortcut is ``api.gateway_app``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from conveyor.api.responses import find_model, version_body
from conveyor.asgi.json import json_response
from conveyor.gateway.status import fleet_document, model_entries

if TYPE_CHECKING:
    from conveyor.gateway.process import Gateway

router = APIRouter()


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    """OpenAI's model list: the union of the healthy workers' models."""
    return json_response({"object": "list", "data": model_entries(_gateway(request))})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: str) -> Response:
    """OpenAI's model object for one model a healthy worker hosts (404 otherwise)."""
    return json_response(find_model(model_entries(_gateway(request)), model_id))


@router.get("/version")
async def version() -> Response:
    """The running Conveyor version (as vLLM's ``/version``)."""
    return json_response(version_body())


@router.get("/v1/fleet")
async def fleet(request: Request) -> Response:
    """Workers, their models, load and heartbeat age; per-model scaling figures."""
    return json_response(fleet_document(_gateway(request)))


@router.get("/health")
async def health() -> Response:
    """Alive: the process answers (with its id: ``--processes`` runs several)."""
    return json_response({"status": "ok", "pid": os.getpid()})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Ready once the worker registry has been read from the store."""
    if _gateway(request).registry.has_refreshed:
        return json_response({"status": "ready", "models": _gateway(request).healthy_models()})
    return json_response({"status": "loading"}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition of the gateway's registry."""
    registry = _gateway(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class _ProxyRoute:
    """``POST /v1/...`` under the job prefixes that no job route took (the shortcut leaves
    those to the router). An app object: Starlette routes to it without a ``Request``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope["app"].state.proxy_app(scope, receive, send)


router.routes.append(Route("/v1/{path:path}", _ProxyRoute(), methods=["POST"]))
