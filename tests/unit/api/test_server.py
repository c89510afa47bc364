"""The uvicorn set-up shared by serve, worker and gateway."""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from conveyor.api.server import uvicorn_config
from conveyor.api.slow_clients import ReadTimeouts, SlowClientProtocol
from conveyor.config import ServerConfig


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Never called."""


def test_every_process_gets_the_timeouts_and_the_cap() -> None:
    config = ServerConfig(max_connections=7, header_timeout_s=1.5, body_timeout_s=2.5)
    settings = uvicorn_config(app, config, host="127.0.0.1", port=0, timeout_keep_alive=30)
    assert settings.app is app  # the app's own edge guards against crashes
    assert settings.limit_concurrency == 7
    assert isinstance(settings.http, type) and issubclass(settings.http, SlowClientProtocol)
    assert settings.http.timeouts == ReadTimeouts(header_timeout_s=1.5, body_timeout_s=2.5)
    assert (settings.timeout_keep_alive, settings.access_log) == (30, False)
    # No X-Forwarded-* is read, so uvicorn's proxy-headers layer is not stacked on each request.
    assert settings.proxy_headers is False
