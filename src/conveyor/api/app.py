"""Build the ASGI application around a ``Service``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from conveyor.api import embeddings, meta
from conveyor.api.auth import ApiKeyMiddleware
from conveyor.api.errors import install_error_handlers
from conveyor.config import ServerConfig
from conveyor.service import Service


def create_app(config: ServerConfig, *, service: Service | None = None) -> FastAPI:
    """The HTTP app; the service's models load during ASGI lifespan start-up."""
    service = service or Service(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="Conveyor", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)
    app.include_router(embeddings.router)
    app.include_router(meta.router)
    app.add_middleware(ApiKeyMiddleware, keys={k.key: k.tenant for k in config.api_keys})
    return app
