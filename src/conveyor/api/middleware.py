"""The middleware every Conveyor app wears, in one place: the body cap, then API keys."""

from __future__ import annotations

from fastapi import FastAPI

from conveyor.api.auth import ApiKeyMiddleware
from conveyor.api.body_limit import UPLOAD_PATHS, BodyLimitMiddleware
from conveyor.config import ServerConfig


def install_middleware(app: FastAPI, config: ServerConfig) -> None:
    """Add the body cap and API-key checks (keys run first: added last, outermost)."""
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=config.max_request_bytes, exempt_paths=UPLOAD_PATHS
    )
    app.add_middleware(
        ApiKeyMiddleware, api_keys=config.api_keys, is_metrics_open=not config.metrics_auth
    )
