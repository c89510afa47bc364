"""The middleware every Conveyor app wears, in one place: the body cap, then API keys."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI

from conveyor.api.auth import ApiKeyMiddleware
from conveyor.api.body_limit import UPLOAD_PATHS, BodyLimitMiddleware
from conveyor.config import ServerConfig
from conveyor.observability.middleware import RequestObserver
from conveyor.observability.tracing import build_provider, tracer_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


def install_middleware(
    app: FastAPI,
    config: ServerConfig,
    *,
    service_name: str = "conveyor-serve",
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Add the body cap, API-key checks and request ids (the last added runs first).

    Traces go to ``tracer_provider`` when given (tests), else to the config's OTLP endpoint.
    """
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=config.max_request_bytes, exempt_paths=UPLOAD_PATHS
    )
    app.add_middleware(
        ApiKeyMiddleware, api_keys=config.api_keys, is_metrics_open=not config.metrics_auth
    )
    app.state.has_api_keys = bool(config.api_keys)
    provider = tracer_provider or build_provider(config.tracing, service_name)
    # Outermost, so a 401 or 413 carries a request id too.
    app.add_middleware(
        RequestObserver,
        tracer=tracer_of(provider),
        log_level=logging.INFO if config.log_format == "json" else logging.DEBUG,
    )
