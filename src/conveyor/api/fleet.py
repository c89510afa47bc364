"""The gateway's HTTP routes: fleet status, model union, health, metrics and the proxy."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from conveyor.api.disconnect import DisconnectWatcher, cancel_current_task
from conveyor.api.responses import find_model, json_response, version_body
from conveyor.api.timeouts import timeout_from_headers
from conveyor.errors import ClientGone, ConveyorError, InvalidRequest, ModelNotFound, QueueFull
from conveyor.fleet.proxy import OutboundRequest, forwardable_headers
from conveyor.fleet.scaling import desired_replicas
from conveyor.openai_paths import PROXIED_ENDPOINTS

if TYPE_CHECKING:
    from conveyor.gateway import Gateway

router = APIRouter()


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def parse_model(body: bytes) -> tuple[str, int]:
    """The request's ``model`` and how many inputs it carries (for the arrival rate)."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = parsed.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    inputs = parsed.get("input")
    # A list of strings or of token lists is one input each; anything else counts once.
    is_many = isinstance(inputs, list) and inputs and not isinstance(inputs[0], int)
    return model, len(inputs) if is_many and isinstance(inputs, list) else 1


def _model_entries(gateway: Gateway) -> list[dict[str, object]]:
    return [
        {"id": name, "object": "model", "created": 0, "owned_by": "conveyor"}
        for name in gateway.healthy_models()
    ]


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    """OpenAI's model list: the union of the healthy workers' models."""
    return json_response({"object": "list", "data": _model_entries(_gateway(request))})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: str) -> Response:
    """OpenAI's model object for one model a healthy worker hosts (404 otherwise)."""
    return json_response(find_model(_model_entries(_gateway(request)), model_id))


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
    """Alive: the process answers."""
    return json_response({"status": "ok"})


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


async def proxy_endpoint(request: Request) -> Response:
    """Route a request to a worker hosting its model (the body is as a worker takes it)."""
    return await proxy(request, request.url.path)


def add_proxy_routes(app: FastAPI) -> None:
    """One documented route per path the gateway forwards; their bodies join the schema."""
    for path in PROXIED_ENDPOINTS:
        app.add_api_route(path, proxy_endpoint, methods=["POST"], summary=f"Proxy {path}")


# Other /v1 paths still reach the workers, undocumented (new worker routes, older gateways).
@router.post("/v1/{path:path}", include_in_schema=False)
async def proxy(request: Request, path: str) -> Response:
    """Route an online request to a worker hosting its model; retry on failure."""
    gateway = _gateway(request)
    started = time.perf_counter()
    body = await request.body()
    model, num_inputs = parse_model(body)
    try:
        response = await _forward(gateway, request, body, model, num_inputs)
    except ConveyorError as exc:
        gateway.metrics.requests.labels(model, str(exc.status_code)).inc()
        raise
    gateway.metrics.requests.labels(model, str(response.status_code)).inc()
    gateway.metrics.latency_s.labels(model).observe(time.perf_counter() - started)
    return response


async def _forward(
    gateway: Gateway, request: Request, body: bytes, model: str, num_inputs: int
) -> Response:
    """Admit, then proxy with the caller's deadline; a client that leaves cancels it."""
    if model not in gateway.registered_models():
        raise ModelNotFound(f"the model {model!r} does not exist", param="model")
    if gateway.num_in_flight >= gateway.settings.max_in_flight:
        raise QueueFull("the gateway is at its in-flight limit", retry_after_s=1)
    gateway.count_arrival(model, num_inputs)
    timeout_ms = timeout_from_headers(request) or gateway.settings.default_timeout_ms
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    outbound = OutboundRequest(
        method=request.method,
        path=path,
        headers=forwardable_headers(request.headers.items()),
        body=body,
        model=model,
        deadline=asyncio.get_running_loop().time() + timeout_ms / 1000,
    )
    gateway.num_in_flight += 1
    watcher = DisconnectWatcher(request.receive, cancel_current_task())
    try:
        return await gateway.proxy.forward(outbound)
    except asyncio.CancelledError:
        if not watcher.is_gone:
            raise
        raise ClientGone("the client disconnected before the result was ready") from None
    finally:
        watcher.close()
        gateway.num_in_flight -= 1


def fleet_document(gateway: Gateway) -> dict[str, Any]:
    """``GET /v1/fleet``: every worker with its models, load and heartbeat age."""
    now = time.time()
    workers = []
    for record, view in zip(gateway.registry.records, gateway.registry.views, strict=True):
        workers.append(
            {
                "id": record.worker_id,
                "address": record.address,
                "models": list(record.models),
                "loaded_models": sorted(view.loaded_models),
                "capacity": record.capacity,
                "load": record.load,
                "gateway_in_flight": gateway.router.in_flight(record.worker_id),
                "heartbeat_age_s": round(now - record.last_heartbeat_at, 3),
                "is_stale": view.is_stale,
                "is_draining": view.is_draining,
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
    return {"object": "fleet", "workers": workers, "models": models}
