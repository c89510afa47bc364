"""The gateway's HTTP routes: fleet status, model union, health, metrics and the proxy."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.api.disconnect import DisconnectWatcher, cancel_current_task
from conveyor.api.errors import error_response
from conveyor.api.proxy_limits import Admitted, ProxyLimits
from conveyor.api.responses import find_model, json_response, version_body
from conveyor.api.timeouts import TIMEOUT_HEADER, timeout_from_headers
from conveyor.errors import ClientGone, ConveyorError, InvalidRequest, QueueFull
from conveyor.fleet.affinity import Affinity
from conveyor.fleet.credential import VOUCHED_HEADERS, FleetCredential, vouch_headers
from conveyor.fleet.proxy import DROPPED_REQUEST_HEADERS, OutboundRequest, ProxiedResponse
from conveyor.fleet.scaling import desired_replicas
from conveyor.openai_paths import PROXIED_ENDPOINTS
from conveyor.tenants.estimate import LIMITED_PATHS
from conveyor.tenants.keyring import ANONYMOUS, Principal

if TYPE_CHECKING:
    from starlette.responses import StreamingResponse

    from conveyor.gateway import Gateway

router = APIRouter()

# Paths under these prefixes belong to the gateway's own Files and Batches routes.
JOB_PREFIXES = ("/v1/files", "/v1/batches")
_MODEL_KEY = b'"model"'
_INPUT_KEY = b'"input"'
_OPENING_BRACE = re.compile(rb"\s*\{")
# After the key: the colon and a plain string (no escapes, no control characters).
_MODEL_VALUE = re.compile(rb'\s*:\s*"([^"\\\x00-\x1f]+)"')
_TIMEOUT_HEADER = TIMEOUT_HEADER.encode("ascii")
# Never passed on from a client: hop-by-hop headers and what only the fleet may say...
_NOT_FORWARDED = DROPPED_REQUEST_HEADERS | VOUCHED_HEADERS
# ...and, when the gateway calls workers with the fleet key, the client's own key.
_NOT_FORWARDED_WITH_FLEET_KEY = _NOT_FORWARDED | {b"authorization"}


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def parse_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object (400 if it is not one)."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return parsed


def model_and_inputs(body: dict[str, Any]) -> tuple[str, int]:
    """A parsed body's ``model`` and how many inputs it carries (for the arrival rate)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    inputs = body.get("input")
    # A list of strings or of token lists is one input each; anything else counts once.
    is_many = isinstance(inputs, list) and inputs and not isinstance(inputs[0], int)
    return model, len(inputs) if is_many and isinstance(inputs, list) else 1


def parse_model(body: bytes) -> tuple[str, int]:
    """The request's ``model`` and how many inputs it carries (for the arrival rate)."""
    return model_and_inputs(parse_object(body))


def scan_model(body: bytes) -> str | None:
    """The top-level ``model`` string found by a byte scan, or None when in any doubt.

    It is sure when ``"model"`` occurs exactly once, not after a backslash (so it does not
    end a string), followed by a colon (so it is a key) and an escape-free string, and the
    key is at the top level: it is the only ``{`` opened before it, or the only ``}`` after
    it closes the body. Anything else (escapes, nesting, repeats, braces inside strings)
    returns None and the caller parses the body.
    """
    at = body.find(_MODEL_KEY)
    if at <= 0 or body.find(_MODEL_KEY, at + 1) >= 0 or body[at - 1] == 0x5C:  # backslash
        return None
    if not _OPENING_BRACE.match(body):
        return None
    is_top_level = body.count(b"{", 0, at) == 1 or (
        body.count(b"}", at) == 1 and body[-64:].rstrip().endswith(b"}")
    )
    value = _MODEL_VALUE.match(body, at + len(_MODEL_KEY)) if is_top_level else None
    if value is None:
        return None
    try:
        return value.group(1).decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_model(body: bytes) -> tuple[str, int]:
    """``parse_model``'s answer, by a byte scan when the body has no ``input`` to count.

    Chat and completion bodies (long prompts, no ``input``) are scanned, not parsed: the
    gateway reads only what routing needs and forwards the bytes as they came; the worker
    validates the body either way.
    """
    if _INPUT_KEY not in body:
        model = scan_model(body)
        if model is not None:
            return model, 1
    return parse_model(body)


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


def is_proxied(scope: Scope) -> bool:
    """An online request for a worker: ``POST /v1/...`` outside Files and Batches."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    path: str = scope["path"]
    if path in PROXIED_ENDPOINTS:  # /tokenize and /detokenize sit outside /v1
        return True
    return path.startswith("/v1/") and not path.startswith(JOB_PREFIXES)


class ProxyApp:
    """The proxy as an ASGI app, with the gateway's rate limits once they are installed."""

    def __init__(self, gateway: Gateway) -> None:
        """Proxy to `gateway`'s workers; no limits until `limits` is set."""
        self.gateway = gateway
        self.limits: ProxyLimits | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await proxy(self.gateway, scope, receive, send, self.limits)


def proxy_shortcut(proxy_app: ProxyApp) -> Callable[[Scope], ASGIApp | None]:
    """Sends online requests straight to the proxy, past FastAPI's routing and request objects.

    Every other request, Files and Batches included, goes on to the app's routes.
    """

    def shortcut(scope: Scope) -> ASGIApp | None:
        return proxy_app if is_proxied(scope) else None

    return shortcut


class _ProxyRoute:
    """``POST /v1/...`` under the job prefixes that no job route took (the shortcut leaves
    those to the router). An app object: Starlette routes to it without a ``Request``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await scope["app"].state.proxy_app(scope, receive, send)


router.routes.append(Route("/v1/{path:path}", _ProxyRoute(), methods=["POST"]))


async def read_body(receive: Receive) -> bytes:
    """The whole request body; ``ClientGone`` if the client leaves while sending it."""
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client disconnected while sending its request")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def proxy(
    gateway: Gateway, scope: Scope, receive: Receive, send: Send, limits: ProxyLimits | None = None
) -> None:
    """Route an online request to a worker hosting its model; retry on failure. With
    `limits`, admit it against its tenant's rate limits first and settle when it ends."""
    started = time.perf_counter()
    model = ""
    admitted: Admitted | None = None
    try:
        body = await read_body(receive)
        if limits is not None and scope["path"] in LIMITED_PATHS:  # parsed once for both
            parsed = parse_object(body)
            model, num_inputs = model_and_inputs(parsed)
            admitted = await limits.admit(scope, parsed)
        else:
            model, num_inputs = read_model(body)
        try:
            response = await _forward(gateway, scope, receive, body, model, num_inputs)
        except BaseException:
            if admitted is not None:
                admitted.release()
            raise
    except ConveyorError as exc:
        if model:
            gateway.metrics.requests.labels(model, str(exc.status_code)).inc()
        await error_response(exc)(scope, receive, send)
        return
    gateway.metrics.requests.labels(model, str(response.status_code)).inc()
    gateway.metrics.latency_s.labels(model).observe(time.perf_counter() - started)
    if admitted is not None:
        await admitted.send(response, scope, receive, send)
    else:
        await response(scope, receive, send)


def _timeout_ms(scope: Scope) -> float | None:
    """The caller's ``X-Conveyor-Timeout-Ms``, validated as everywhere else."""
    for name, _ in scope["headers"]:
        if name == _TIMEOUT_HEADER:
            return timeout_from_headers(Request(scope))
    return None


def _target(scope: Scope) -> str:
    """The request target as the client sent it (still percent-encoded), with its query."""
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    query: bytes = scope.get("query_string", b"")
    return (raw_path + b"?" + query if query else raw_path).decode("latin-1")


async def _forward(
    gateway: Gateway, scope: Scope, receive: Receive, body: bytes, model: str, num_inputs: int
) -> ProxiedResponse | StreamingResponse:
    """Admit, then proxy with the caller's deadline; a client that leaves cancels it."""
    gateway.check_model(model)
    if gateway.num_in_flight >= gateway.settings.max_in_flight:
        raise QueueFull("the gateway is at its in-flight limit", retry_after_s=1)
    gateway.count_arrival(model, num_inputs)
    timeout_ms = _timeout_ms(scope) or gateway.settings.default_timeout_ms
    outbound = OutboundRequest(
        method=scope["method"],
        path=_target(scope),
        headers=worker_headers(scope, gateway.credential),
        body=body,
        model=model,
        deadline=asyncio.get_running_loop().time() + timeout_ms / 1000,
        affinity=await _affinity(gateway, scope, body, model),
    )
    gateway.num_in_flight += 1
    watcher = DisconnectWatcher(receive, cancel_current_task(), scope)
    try:
        return await gateway.proxy.forward(outbound)
    except asyncio.CancelledError:
        if not watcher.is_gone:
            raise
        raise ClientGone("the client disconnected before the result was ready") from None
    finally:
        watcher.close()
        gateway.num_in_flight -= 1


def worker_headers(scope: Scope, credential: FleetCredential | None) -> list[tuple[bytes, bytes]]:
    """The headers a worker gets: the client's, less hop-by-hop ones and any a client may not
    send (``X-Conveyor-Tenant``); with the fleet key, that key instead of the client's and
    the caller the gateway authenticated."""
    if credential is None:
        return [(k, v) for k, v in scope["headers"] if k.lower() not in _NOT_FORWARDED]
    dropped = _NOT_FORWARDED_WITH_FLEET_KEY
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in dropped]
    principal = scope.get("state", {}).get("principal", ANONYMOUS)
    if not isinstance(principal, Principal):  # set by the key middleware, always in front
        principal = ANONYMOUS
    headers.append((b"authorization", credential.authorization))
    headers.extend(vouch_headers(principal.tenant, principal.is_admin))
    return headers


async def _affinity(gateway: Gateway, scope: Scope, body: bytes, model: str) -> Affinity | None:
    """The request's prefix and session hint, when the gateway routes by affinity."""
    if gateway.router.affinity is None:
        return None
    sizes = {h.block_size for v in gateway.registry.views if (h := v.prefixes.get(model))}
    return await gateway.hints.read(scope["path"], scope["headers"], body, model, sizes)


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
                "models": list(record.models),
                "loaded_models": sorted(view.loaded_models),
                "capacity": record.capacity,
                "load": _without_digests(record.load),
                "prefix_blocks": {m: len(h.keys) for m, h in view.prefixes.items()},
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
    routed = dict(gateway.router.num_routed)
    return {"object": "fleet", "workers": workers, "models": models, "routed_by": routed}
