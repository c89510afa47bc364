"""The gateway's HTTP app: Files, Batches (Message Batches too), stored responses, fleet
status and the proxy on one ``Gateway``."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import conveyor
from conveyor.api import batches as batch_routes
from conveyor.api import dashboard as dashboard_routes
from conveyor.api import files as file_routes
from conveyor.api import fleet as fleet_routes
from conveyor.api import message_batches as message_batch_routes
from conveyor.api import stored_responses as stored_response_routes
from conveyor.api import usage as usage_routes
from conveyor.api.edge import EdgeApp
from conveyor.api.errors import install_error_handlers
from conveyor.api.fastapi_options import fastapi_options
from conveyor.api.middleware import install_middleware
from conveyor.api.openapi import install_openapi
from conveyor.config.settings import ServerConfig
from conveyor.fleet.credential import credential_from
from conveyor.fleet.registry_store import WorkerRegistryStore
from conveyor.gateway.limits import ProxyLimits
from conveyor.gateway.process import Gateway, GatewaySettings, gateway_jobs
from conveyor.gateway.proxy import ProxyApp, proxy_shortcut
from conveyor.stores import open_job_store, open_object_store
from conveyor.stores.protocols import ApiKeyStore

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


# The fleet router last: its catch-all POST /v1/{path} would swallow the others' routes.
_ROUTERS = (
    file_routes.router,
    batch_routes.router,
    message_batch_routes.router,
    stored_response_routes.router,
    dashboard_routes.router,
    usage_routes.router,
    fleet_routes.router,
)


@asynccontextmanager
async def _lifespan(app: EdgeApp) -> AsyncIterator[None]:
    """Start the guards (key ring), the gateway and its jobs; stop them in reverse."""
    guards, gateway, jobs = app.state.guards, app.state.gateway, app.state.jobs
    await guards.start()
    await gateway.start()
    await jobs.start()
    # As on `serve`: what start-up loaded lives as long as the process; frozen, full
    # collections stop rescanning it and no longer stall the event loop under load.
    gc.freeze()
    try:
        yield
    finally:
        await jobs.stop()
        await guards.stop()  # before the gateway closes the store it reads keys from
        await gateway.stop()


def create_gateway_app(
    settings: GatewaySettings,
    config: ServerConfig,
    *,
    store: WorkerRegistryStore | None = None,
    tracer_provider: TracerProvider | None = None,
) -> EdgeApp:
    """The gateway's HTTP app; API keys come from ``config`` (its models are ignored).

    ``tracer_provider`` replaces the one the config's ``tracing`` section would build.
    """
    objects = open_object_store(settings.objects_url) if settings.objects_url else None
    registry_store = store or open_job_store(settings.store_url)
    credential = credential_from(config.fleet)
    gateway = Gateway(settings, registry_store, objects=objects, credential=credential)
    jobs = gateway_jobs(gateway, config)
    app = EdgeApp(
        title="Conveyor gateway",
        version=conveyor.__version__,
        lifespan=_lifespan,
        **fastapi_options(),
    )
    app.state.gateway = gateway
    app.state.proxy_app = proxy_app = ProxyApp(gateway)
    app.state.jobs = jobs
    install_error_handlers(app)
    for router in _ROUTERS:
        app.include_router(router)
    install_openapi(app)
    key_store = registry_store if isinstance(registry_store, ApiKeyStore) else None
    guards = install_middleware(
        app,
        config,
        counter=gateway.metrics.http_requests,
        # Online requests go straight to the proxy once the keys, limits and body cap passed.
        shortcut=proxy_shortcut(proxy_app),
        key_store=key_store,
        registry=gateway.metrics.registry,
        service_name="conveyor-gateway",
        tracer_provider=tracer_provider,
    )
    if guards.gate is not None:  # the proxy applies them: it reads every body anyway
        proxy_app.limits = ProxyLimits(guards.gate)
    return app
