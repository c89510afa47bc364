"""The middleware every Conveyor app wears, in one place: CORS, API keys, the body cap."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from conveyor.api.auth import ApiKeyMiddleware
from conveyor.api.body_limit import UPLOAD_PATHS, BodyLimitMiddleware
from conveyor.config import ServerConfig


def install_middleware(app: FastAPI, config: ServerConfig) -> None:
    """Add the body cap, API-key checks and CORS (the last added runs first).

    CORS is outermost so a browser's preflight ``OPTIONS`` (which carries no key) is
    answered before the key check, and error responses carry the CORS headers too.
    """
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=config.max_request_bytes, exempt_paths=UPLOAD_PATHS
    )
    app.add_middleware(
        ApiKeyMiddleware, api_keys=config.api_keys, is_metrics_open=not config.metrics_auth
    )
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )
