"""The uvicorn set-up every Conveyor process shares (``serve``, ``worker``, ``gateway``)."""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.types import ASGIApp

from conveyor.api.crash_guard import CrashGuard
from conveyor.config import ServerConfig


def uvicorn_config(
    app: ASGIApp, config: ServerConfig, *, host: str, port: int, **options: Any
) -> uvicorn.Config:
    """uvicorn settings for ``app``: the crash guard outermost, httptools, no access log.

    ``options`` are passed on to ``uvicorn.Config`` (a keep-alive or shutdown timeout).
    """
    return uvicorn.Config(
        CrashGuard(app),
        host=host,
        port=port,
        http="httptools",
        log_level=config.log_level,
        access_log=False,
        **options,
    )
