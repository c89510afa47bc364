"""The uvicorn set-up every Conveyor process shares (``serve``, ``worker``, ``gateway``)."""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from conveyor.api.connection_limits import HeadLimits, ReadTimeouts
from conveyor.api.slow_clients import slow_client_protocol
from conveyor.config.settings import ServerConfig


def connection_protocol(config: ServerConfig) -> type[HttpToolsProtocol]:
    """The server protocol with the config's read timeouts, head limits and connection cap."""
    timeouts = ReadTimeouts(
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
        body_min_bytes_per_s=config.body_min_bytes_per_s,
    )
    head_limits = HeadLimits(
        max_header_bytes=config.max_header_bytes, max_headers=config.max_headers
    )
    return slow_client_protocol(timeouts, head_limits, max_connections=config.max_connections)


def uvicorn_config(
    app: ASGIApp, config: ServerConfig, *, host: str, port: int, **options: Any
) -> uvicorn.Config:
    """uvicorn settings for ``app``: httptools with Conveyor's connection guards (read
    timeouts, head limits, the connection cap: `api.slow_clients`), no access log (the
    app's own edge guards against crashes and logs requests).

    ``options`` are passed on to ``uvicorn.Config`` (a keep-alive or shutdown timeout).
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=connection_protocol(config),
        # The protocol's budget is the cap: uvicorn's own counts every open connection,
        # so connections that never send a request would fill it.
        limit_concurrency=None,
        # Conveyor serves no WebSocket route: an upgrade request is a plain request.
        ws="none",
        log_level=config.log_level,
        access_log=False,
        # Conveyor reads no X-Forwarded-* header: uvicorn's proxy-headers layer would cost
        # every request a middleware hop for nothing.
        proxy_headers=False,
        **options,
    )
