"""The uvicorn set-up every Conveyor process shares (``serve``, ``worker``, ``gateway``)."""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.types import ASGIApp

from conveyor.api.slow_clients import ReadTimeouts, slow_client_protocol
from conveyor.config import ServerConfig


def uvicorn_config(
    app: ASGIApp, config: ServerConfig, *, host: str, port: int, **options: Any
) -> uvicorn.Config:
    """uvicorn settings for ``app``: httptools with read timeouts, the connection cap, no
    access log (the app's own edge guards against crashes and logs requests).

    ``options`` are passed on to ``uvicorn.Config`` (a keep-alive or shutdown timeout).
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=slow_client_protocol(
            ReadTimeouts(
                header_timeout_s=config.header_timeout_s, body_timeout_s=config.body_timeout_s
            )
        ),
        limit_concurrency=config.max_connections,
        log_level=config.log_level,
        access_log=False,
        # Conveyor reads no X-Forwarded-* header: uvicorn's proxy-headers layer would cost
        # every request a middleware hop for nothing.
        proxy_headers=False,
        **options,
    )
