"""The gateway's proxy as an ASGI app: which requests it takes, and taking one.

It reads the body, admits the request against the tenant's limits (``gateway.limits``),
watches for a client that leaves and answers errors; what it reads from the body
(``gateway.sniff``), what a worker is sent and the retrying itself (``gateway.forward``)
live beside it. The route table that mounts it is ``api.fleet``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.asgi.disconnect import disconnect_cancels
from conveyor.asgi.json import error_response
from conveyor.asgi.timeouts import TIMEOUT_HEADER, timeout_from_headers
from conveyor.errors import ClientGone, ConveyorError, QueueFull
from conveyor.gateway.forward import (
    OutboundRequest,
    ProxiedResponse,
    affinity_hint,
    principal_of,
    request_target,
    worker_headers,
)
from conveyor.gateway.limits import Admitted, ProxyLimits
from conveyor.gateway.sniff import model_and_inputs, parse_object, read_model
from conveyor.openai_paths import PROXIED_ENDPOINTS
from conveyor.tenants.estimate import LIMITED_PATHS

if TYPE_CHECKING:
    from starlette.responses import StreamingResponse

    from conveyor.gateway.process import Gateway

# Paths under these prefixes belong to the gateway's own Files and Batches routes (Message
# Batches too) and stored responses (a new response, ``POST /v1/responses``, goes to a worker).
JOB_PREFIXES = ("/v1/files", "/v1/batches", "/v1/messages/batches", "/v1/responses/")
_TIMEOUT_HEADER = TIMEOUT_HEADER.encode("ascii")


def is_proxied(scope: Scope) -> bool:
    """An online request for a worker: ``POST /v1/...`` outside Files, Batches and stored
    responses."""
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


async def _forward(
    gateway: Gateway, scope: Scope, receive: Receive, body: bytes, model: str, num_inputs: int
) -> ProxiedResponse | StreamingResponse:
    """Admit, then proxy with the caller's deadline; a client that leaves cancels it."""
    gateway.check_model(model)
    regions = gateway.check_residency(principal_of(scope).tenant, model)
    if gateway.num_in_flight >= gateway.settings.max_in_flight:
        raise QueueFull("the gateway is at its in-flight limit", retry_after_s=1)
    gateway.admit_failover(model)
    gateway.count_arrival(model, num_inputs)
    timeout_ms = _timeout_ms(scope) or gateway.settings.default_timeout_ms
    outbound = OutboundRequest(
        method=scope["method"],
        path=request_target(scope),
        headers=worker_headers(scope, gateway.credential),
        body=body,
        model=model,
        deadline=asyncio.get_running_loop().time() + timeout_ms / 1000,
        affinity=await affinity_hint(gateway, scope, body, model),
        regions=regions,
    )
    gateway.num_in_flight += 1
    try:
        with disconnect_cancels(receive, scope):
            return await gateway.proxy.forward(outbound)
    finally:
        gateway.num_in_flight -= 1
