"""Build the ASGI application around a ``Service``."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import conveyor
from conveyor.api import (
    batches,
    dashboard,
    files,
    inference,
    lora,
    message_batches,
    messages,
    meta,
    responses_api,
    stored_responses,
    usage,
)
from conveyor.api.edge import EdgeApp, direct_routes
from conveyor.api.errors import install_error_handlers
from conveyor.api.fastapi_options import fastapi_options
from conveyor.api.middleware import install_middleware
from conveyor.api.openapi import install_openapi
from conveyor.api.residency import Residency
from conveyor.config.settings import ServerConfig
from conveyor.endpoints.dispatch import jobs_for_service
from conveyor.endpoints.responses.background import start_runner
from conveyor.fleet.credential import FleetCredential
from conveyor.host.service import Service
from conveyor.jobs.subsystem import JobsSubsystem
from conveyor.stores import open_job_store

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


# Run straight from the edge's guards, past FastAPI's middleware, routing and request
# machinery (dependency solving, body and response models): the handler parses and answers.
DIRECT_PATHS = frozenset({"/v1/embeddings"})


def _add_routes(app: EdgeApp) -> None:
    """Every route ``serve`` answers, and their documentation."""
    app.add_route("/v1/embeddings", inference.create_embeddings, methods=["POST"])
    app.include_router(inference.router)
    app.include_router(responses_api.router)
    app.include_router(stored_responses.router)
    app.include_router(messages.router)
    app.include_router(message_batches.router)
    app.include_router(meta.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(dashboard.router)
    app.include_router(usage.router)
    app.include_router(lora.router)
    install_openapi(app)


@asynccontextmanager
async def _jobs_running(app: EdgeApp, service: Service, jobs: JobsSubsystem) -> AsyncIterator[None]:
    """Batch jobs, background responses and the online usage ledger, while the app runs."""
    await jobs.start()
    app.state.background = background = start_runner(service, jobs)
    service.ledger.start(jobs.context.store.blocking)
    try:
        yield
    finally:
        await service.ledger.stop()  # the last online usage, while the store is open
        if background is not None:
            await background.stop()  # running responses are handed back
        await jobs.stop()  # running shards hand their leases back


def create_app(
    config: ServerConfig,
    *,
    service: Service | None = None,
    jobs: JobsSubsystem | None = None,
    key_store_url: str | None = None,
    with_rate_limits: bool = True,
    tracer_provider: TracerProvider | None = None,
    fleet_credential: FleetCredential | None = None,
    residency: Residency | None = None,
) -> EdgeApp:
    """The HTTP app; the service's models load during ASGI lifespan start-up.

    With `key_store_url`, the API keys stored there (``conveyor keys``) are accepted too.
    A fleet worker passes `with_rate_limits=False`: its gateways already applied them; and
    its `fleet_credential`, if any: the fleet key its gateways call it with; and its
    `residency`: its region, where it refuses tenants pinned elsewhere.
    ``tracer_provider`` replaces the one the config's ``tracing`` section would build.
    """
    service = service or Service(config)
    jobs = jobs or jobs_for_service(service)

    @asynccontextmanager
    async def lifespan(app: EdgeApp) -> AsyncIterator[None]:
        await guards.start()
        await service.start()
        try:
            async with _jobs_running(app, service, jobs):
                # Everything loaded so far (models, libraries) lives as long as the process:
                # frozen, the collector stops rescanning it, so full collections no longer
                # stall the event loop for 100+ ms under load.
                gc.freeze()
                yield
        finally:
            await service.stop()
            await guards.stop()

    app = EdgeApp(
        title="Conveyor", version=conveyor.__version__, lifespan=lifespan, **fastapi_options()
    )
    app.state.service = service
    app.state.jobs = jobs
    install_error_handlers(app)
    _add_routes(app)
    key_store = open_job_store(key_store_url) if key_store_url is not None else None
    guards = install_middleware(
        app,
        config,
        counter=service.metrics.http_requests,
        shortcut=direct_routes(app, DIRECT_PATHS),
        key_store=key_store,
        owns_key_store=True,
        registry=service.metrics.registry,
        with_rate_limits=with_rate_limits,
        counts_tokens=True,
        tracer_provider=tracer_provider,
        fleet_credential=fleet_credential,
        residency=residency,
    )
    return app
